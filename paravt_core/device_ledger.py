"""The device ledger: which process plans to hold how much of which GPU, and when (#60 Build item 2).

A process that loads a model onto a device declares it (`declare`): its role, the GPU (the
physical index, through CUDA_VISIBLE_DEVICES) and the bytes the memory plan gives that stage
(`plan.stage_bytes`). A claim lasts until the process ends, since PyTorch's caching allocator
returns nothing to the card before then: a stage that loads a model in the flow process keeps
that memory beside every later stage (the SFT grammar check beside RL rank 0, #60 finding 1).
So every such stage runs in a process of its own, and the flow process declares nothing.

Declarations are appended, one JSON line each, to the file PARAVT_DEVICE_LEDGER names
(`paravt rehearse` sets it for all its processes, `paravt_core/rehearsal.py`); without it
`declare` does nothing. A model server is declared by the process that starts it, at its static
share of the card, and released when stopped. A claim is checked when it is made, against the
claims of processes still running: the stage that could not have its memory fails at once.
`check_ledger` is the assertion a rehearsal makes at its end: the flow process holds no device
memory, and no GPU has more planned at one time than the card.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LEDGER_ENV = "PARAVT_DEVICE_LEDGER"
# The model and card the claims are planned for: a rehearsal on the tiny model plans the real
# run's (e.g. Qwen/Qwen3-VL-8B-Instruct on 80 GB cards); unset, the loaded model and this card.
PLANNED_MODEL_ENV = "PARAVT_LEDGER_MODEL"
PLANNED_GPU_BYTES_ENV = "PARAVT_LEDGER_GPU_BYTES"
# ... and the config they are planned for: a rehearsal runs small sizes (frames, new tokens) and
# plans the real run's (a JSON dump of its config); unset, the config the process runs.
PLANNED_CONFIG_ENV = "PARAVT_LEDGER_CONFIG"
DEFAULT_GPU_BYTES = 80 * 10**9  # an H100 80 GB, where no card is visible


class LedgerError(AssertionError):
    """The ledger shows a process holding device memory where the run cannot afford it."""


@dataclass(frozen=True)
class Claim:
    """`planned_bytes` of GPU `gpu` held by process `pid` (`role`) from `start` to `end`
    (None: the process had not ended when the ledger was read, or was killed)."""

    role: str
    pid: int
    gpu: int
    planned_bytes: int
    start: float
    end: float | None = None


def physical_gpu(local_index: int = 0, env: dict[str, str] | None = None) -> int:
    """The card a process's `cuda:<local_index>` is: CUDA_VISIBLE_DEVICES maps it (numeric lists)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    listed = [part.strip() for part in visible.split(",") if part.strip()]
    if local_index < len(listed) and listed[local_index].isdigit():
        return int(listed[local_index])
    return local_index


_released: set[tuple[str, int]] = set()  # (ledger file, pid) whose release is registered


def _append(path: Path, record: dict) -> None:
    # One short write of a whole line in append mode: lines of concurrent processes do not interleave.
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def declare(role: str, gpus: Sequence[int], planned_bytes: int, ledger: str | os.PathLike | None = None,
            pid: int | None = None) -> None:
    """Record that a process holds `planned_bytes` on each of `gpus` until it ends: this one (a
    line written at its exit closes the claim; a killed process's claim stays open), or `pid`, a
    server this process started, whose claim `release(pid)` closes when it is stopped. A no-op
    when no ledger is named (argument or PARAVT_DEVICE_LEDGER).

    The claim is checked at once against the claims alive now, as the card would check the
    allocation: the rehearsal of a run fails at the stage that would run out of memory, naming
    what holds the card, not at its end.

    Raises:
        LedgerError: with this claim, a GPU holds more than `planned_gpu_bytes()`.
    """
    ledger = ledger or os.environ.get(LEDGER_ENV)
    if not ledger:
        return
    path, own = Path(ledger), pid is None
    pid = os.getpid() if own else int(pid)
    # A server's claim ends at its release, or else with the process that started it: a server
    # gets SIGTERM when its launcher dies (`agent.server_process`, PR_SET_PDEATHSIG).
    by = {} if own else {"by": os.getpid()}
    for gpu in gpus:
        _append(path, {"event": "hold", "role": role, "pid": pid, "gpu": int(gpu),
                       "planned_bytes": int(planned_bytes), "time": time.time(), **by})
    if own and (str(path), pid) not in _released:
        _released.add((str(path), pid))
        atexit.register(lambda: os.getpid() == pid and release(pid, path))
    problems = overcommits([c for c in alive_claims(read_ledger(path)) if c.gpu in set(gpus)], planned_gpu_bytes())
    if problems:
        raise LedgerError(f"device ledger ({path}): {role} (pid {pid}) cannot have its memory:\n"
                          + "\n".join(f"  - {p}" for p in problems)
                          + "\n  (a process that loads a model keeps its memory until it ends: the earlier stage "
                            "must run in a process of its own, paravt_core/own_process.py)")


def release(pid: int, ledger: str | os.PathLike | None = None) -> None:
    """Close the claims of process `pid` (it ended, or its server was stopped); a no-op without a ledger."""
    ledger = ledger or os.environ.get(LEDGER_ENV)
    if ledger:
        _append(Path(ledger), {"event": "release", "pid": int(pid), "time": time.time()})


def declare_server(role: str, pid: int, gpus: Sequence[int], fraction: float) -> None:
    """`declare` a model server's claim: `fraction` of each of its cards, the static share vLLM
    (`gpu_memory_utilization`) or SGLang (`mem_fraction_static`) takes of it at start-up (and
    refuses to start without, free)."""
    if os.environ.get(LEDGER_ENV):
        declare(role, gpus, int(fraction * planned_gpu_bytes()), pid=pid)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive_claims(claims: Sequence[Claim]) -> list[Claim]:
    """The claims whose process still runs (a killed process's memory went back to the card with it)."""
    return [c for c in claims if c.end is None and _running(c.pid)]


def planned_gpu_bytes() -> int:
    """The card the claims are planned on: PARAVT_LEDGER_GPU_BYTES, else GPU 0's, else 80 GB."""
    if os.environ.get(PLANNED_GPU_BYTES_ENV):
        return int(os.environ[PLANNED_GPU_BYTES_ENV])
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else DEFAULT_GPU_BYTES


def read_ledger(ledger: str | os.PathLike) -> list[Claim]:
    """Every claim of the ledger file, closed at its process's release line where there is one."""
    holds, ends = [], {}
    for number, line in enumerate(Path(ledger).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if record["event"] == "release":  # the first: the process's own, or its launcher's after it
                ends.setdefault(int(record["pid"]), float(record["time"]))
            else:
                holds.append(record)
        except (ValueError, KeyError, TypeError) as err:
            raise LedgerError(f"{ledger}: line {number} is not a ledger record ({err!r})") from None
    return [Claim(h["role"], int(h["pid"]), int(h["gpu"]), int(h["planned_bytes"]), float(h["time"]),
                  ends.get(int(h["pid"]), ends.get(int(h.get("by", -1))))) for h in holds]


def overcommits(claims: Sequence[Claim], gpu_bytes: int) -> list[str]:
    """Each moment a claim starts on a GPU whose claims then alive add up to more than
    `gpu_bytes`, named with the processes (one line per GPU and set of processes)."""
    found: dict[tuple[int, tuple[int, ...]], str] = {}
    for claim in claims:
        alive = [c for c in claims if c.gpu == claim.gpu and c.start <= claim.start
                 and (c.end is None or c.end > claim.start)]
        total = sum(c.planned_bytes for c in alive)
        key = (claim.gpu, tuple(sorted({c.pid for c in alive})))
        if total > gpu_bytes and len(key[1]) > 1 and key not in found:
            who = " + ".join(f"{c.role} (pid {c.pid}, {c.planned_bytes / 1e9:.1f} GB)" for c in alive)
            found[key] = (f"GPU {claim.gpu}: {who} = {total / 1e9:.1f} GB at once, over the card's "
                          f"{gpu_bytes / 1e9:.1f} GB")
    return list(found.values())


def check_ledger(claims: Sequence[Claim], gpu_bytes: int, flow_pid: int) -> None:
    """The rehearsal's assertion: the flow process (`flow_pid`) declared no device memory, and no
    two processes plan more of one GPU at once than the card has.

    Raises:
        LedgerError: naming each offending claim and what to do.
    """
    problems = [f"the flow process (pid {flow_pid}) holds {c.planned_bytes / 1e9:.1f} GB of GPU {c.gpu} for "
                f"{c.role} until the run ends: run that stage in a process of its own"
                for c in claims if c.pid == flow_pid]
    problems += overcommits(claims, gpu_bytes)
    if problems:
        raise LedgerError("device ledger:\n" + "\n".join(f"  - {p}" for p in problems))
