"""A dress rehearsal of a GPU run on this machine's CPU (`paravt rehearse`, #60 Build item 1).

A config's stages were each checked alone; what breaks a first 8B run is where they meet (a
stage that keeps its model's memory beside the next, a server started on a card another
process holds, a checkpoint the next stage cannot read). The rehearsal runs config C's own
pipeline end to end, with every process where C puts it: its rank counts and placements
(CUDA_VISIBLE_DEVICES and LOCAL_RANK as on the GPU node), its rollout engine, weight push and
served-policy probe, the evaluation serving each checkpoint with its data-parallel launch, the
quarantine and its ceiling, `keep_last`, the grammar check in its own process, registration
and promotion. What it changes is listed by `rehearsal_changes` and printed before the run:

- the model: the tiny Qwen3-VL built here (`model.base: tiny`: the real architecture,
  processor and token layout, random weights) in place of `model.base`;
- the data: the generated long-video world laid out as a local hub mirror
  (`data.source: synth`), which the same download, materialization and contract code reads;
- the sizes that scale: steps (with a checkpoint every step, so `keep_last` prunes), batch
  (group size, accumulation), frames and pixels, token limits, samples per split;
- a count this machine cannot hold: the evaluation's data-parallel replicas (each a vLLM
  engine process of its own) are lowered to `replicas`, the launch path kept.

Nothing can measure GPU memory here, so the memory plan stands in for it: every process that
would hold a card declares the plan's bytes for it in the device ledger (`device_ledger.py`,
planned for C's own model and the real card), a claim the card cannot hold fails the stage
that makes it, and at the end the flow process must hold nothing. What only a GPU shows (CUDA
kernels, NCCL, the plan's own accuracy, speed) is listed in `GPU_ONLY`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.atomic import atomic_write_text
from paravt_core.config import PipelineConfig, load_config
from paravt_core.device_ledger import (
    LEDGER_ENV,
    PLANNED_CONFIG_ENV,
    PLANNED_GPU_BYTES_ENV,
    PLANNED_MODEL_ENV,
    Claim,
    LedgerError,
    check_ledger,
    read_ledger,
)

SUMMARY = "rehearsal.json"  # the rehearsal's outcome, in its output folder (and its mark)
# Evaluation replicas at once: each is a vLLM CPU engine with its own model copy and its
# VLLM_CPU_KVCACHE_SPACE (1 GB) of host memory; 2 ran here (one reading while they served: 16 of 23 GB available),
# 8 were not tried (--eval-replicas raises it).
DEFAULT_REPLICAS = 2
GPU_ONLY = (
    "CUDA kernels (flash attention, fused optimizers, the servers' CUDA graphs) and NCCL: the rehearsal's ranks "
    "run DeepSpeed's CPU accelerator (gloo/shared memory) and vLLM's CPU build",
    "the GPU memory each process really takes: the ledger holds the memory plan's figures, not measurements "
    "(`make gpu-check` measures them on a GPU)",
    "bfloat16 training numerics (DeepSpeed trains in float32 on CPU) and speed, and the 8B model's own weights "
    "and processor files",
)


@dataclass(frozen=True)
class Change:
    """One setting the rehearsal runs at another value than config C, and why."""

    key: str
    real: Any
    rehearsed: Any
    why: str


def _smaller(key: str, real: Any, small: Any, why: str) -> list[Change]:
    return [Change(key, real, small, why)] if real != small and (real is None or small < real) else []


def rehearsal_changes(cfg: PipelineConfig, replicas: int = DEFAULT_REPLICAS) -> list[Change]:
    """Every override a rehearsal of `cfg` applies (`module docstring`), in `--set` order."""
    sizes = "a size that scales"
    v, sft, rl, ev = cfg.video, cfg.sft, cfg.rl, cfg.eval
    changes = [Change("run.output_dir", str(cfg.run.output_dir), f"{cfg.run.output_dir}-rehearsal",
                      "the rehearsal's outputs (and its MLflow store) apart from the real run's")]
    if cfg.model.base != "tiny":
        changes.append(Change("model.base", cfg.model.base, "tiny",
                              "the tiny Qwen3-VL built here: the real architecture, processor and token layout, "
                              "random weights"))
    if cfg.data.source != "synth":
        changes.append(Change("data.source", cfg.data.source, "synth",
                              "the generated world as a local hub mirror, read by the same download code offline"))
        if cfg.data.benchmark_revisions:
            changes.append(Change("data.benchmark_revisions", dict(cfg.data.benchmark_revisions), {},
                                  "the mirror holds each benchmark at its one revision"))
    for key, real, small in (("video.nframes", v.nframes, 4), ("video.sft_max_frames", v.sft_max_frames, 4),
                             ("video.crop_max_frames", v.crop_max_frames, 2), ("video.max_pixels", v.max_pixels, 3072),
                             ("sft.max_steps", sft.max_steps, 4), ("sft.grad_accum_steps", sft.grad_accum_steps, 1),
                             ("sft.max_seq_len", sft.max_seq_len, 2048),
                             ("rl.max_steps", rl.max_steps, 3), ("rl.group_size", rl.group_size, 2),
                             ("rl.rollout.max_new_tokens", rl.rollout.max_new_tokens, 32),
                             ("rl.rollout.subagent_max_new_tokens", rl.rollout.subagent_max_new_tokens, 32),
                             ("rl.rollout.tool_response_max_tokens", rl.rollout.tool_response_max_tokens, 64),
                             ("eval.nframes", ev.nframes, 4), ("eval.max_new_tokens", ev.max_new_tokens, 32),
                             ("eval.max_samples_per_split", ev.max_samples_per_split, 1)):
        changes += _smaller(key, real, small, sizes)
    # A checkpoint every step, so that retention (keep_last) prunes within the few steps run.
    changes += _smaller("sft.checkpoint_every", sft.checkpoint_every, 1, "every step, so keep_last prunes")
    changes += _smaller("rl.checkpoint_every", rl.checkpoint_every, 1, "every step, so keep_last prunes")
    if len(ev.gpus) > replicas:
        changes.append(Change("eval.gpus", list(ev.gpus), list(ev.gpus[:replicas]),
                              f"{len(ev.gpus)} data-parallel vLLM engines, each with its own host memory, are not tried here: "
                              f"{replicas} through the same launch (`vllm serve --data-parallel-size`)"))
    return changes


def overrides(changes: list[Change]) -> list[str]:
    """The changes as `--set KEY=VALUE` overrides (JSON values: lists, dicts, numbers, strings)."""
    return [f"{c.key}={json.dumps(c.rehearsed) if not isinstance(c.rehearsed, str) else c.rehearsed}"
            for c in changes]


def rehearsal_config(config_path: str | os.PathLike, user_overrides: list[str], rl_row: str | None = None,
                     replicas: int = DEFAULT_REPLICAS) -> tuple[PipelineConfig, PipelineConfig, list[Change], list[str]]:
    """(config C as written, the rehearsed config, the changes, the overrides that give it); the
    user's own overrides apply to both, and a key the user sets is not changed."""
    real = load_config(config_path, user_overrides, rl_row)
    own = {override.split("=", 1)[0].strip() for override in user_overrides}
    changes = [c for c in rehearsal_changes(real, replicas) if c.key not in own]  # the user's value stands
    sets = overrides(changes) + list(user_overrides)
    return real, load_config(config_path, sets, rl_row), changes, sets


def ledger_environment(real: PipelineConfig, ledger: Path, gpu_bytes: int) -> dict[str, str]:
    """The variables every process of the rehearsal inherits: where to declare, and the config,
    model and card the claims are planned for (config C's sizes and model, not the rehearsal's;
    C is written beside the ledger)."""
    planned = atomic_write_text(ledger.with_name("planned_config.json"), real.model_dump_json(indent=1))
    env = {LEDGER_ENV: str(ledger), PLANNED_GPU_BYTES_ENV: str(gpu_bytes), PLANNED_CONFIG_ENV: str(planned)}
    if real.model.base != "tiny":  # the tiny model plans as itself (its folder's config.json)
        env[PLANNED_MODEL_ENV] = str(real.model.base)
    return env


def format_changes(changes: list[Change]) -> str:
    width = max((len(c.key) for c in changes), default=10)
    lines = [f"  {'setting':<{width}}  {'config':<28} rehearsal", f"  {'-' * width}  {'-' * 28} ---------"]
    for c in changes:
        lines.append(f"  {c.key:<{width}}  {str(c.real)[:28]:<28} {c.rehearsed}   ({c.why})")
    return "\n".join(lines)


def ledger_table(claims: list[Claim], gpu_bytes: int) -> str:
    """Per GPU: each process's planned claim, and the most held at once, against the card."""
    lines = [f"  {'GPU':>3}  {'most at once':>12}  claims (planned GB, process)"]
    for gpu in sorted({c.gpu for c in claims}):
        on = [c for c in claims if c.gpu == gpu]
        peak = max(sum(o.planned_bytes for o in on if o.start <= c.start and (o.end is None or o.end > c.start))
                   for c in on)
        who = ", ".join(f"{c.role} {c.planned_bytes / 1e9:.1f}" for c in sorted(on, key=lambda c: c.start))
        lines.append(f"  {gpu:>3}  {peak / 1e9:>9.1f} GB  {who}")
    lines.append(f"  card: {gpu_bytes / 1e9:.1f} GB")
    return "\n".join(lines)


def verify(ledger: Path, gpu_bytes: int, flow_pid: int, expected_roles: tuple[str, ...] = ()) -> list[Claim]:
    """The rehearsal's assertion at its end (`device_ledger.check_ledger`), plus: each role in
    `expected_roles` (a prefix) declared at least once, so a process that stopped declaring
    cannot pass by silence.

    Raises:
        LedgerError: naming each problem.
    """
    claims = read_ledger(ledger) if ledger.is_file() else []
    missing = [role for role in expected_roles if not any(c.role.startswith(role) for c in claims)]
    if missing:
        raise LedgerError(f"device ledger {ledger}: no claim of {missing}: a process that holds a card did not "
                          "declare it (device_ledger.declare)")
    check_ledger(claims, gpu_bytes, flow_pid)
    return claims


def expected_roles(cfg: PipelineConfig) -> tuple[str, ...]:
    """The processes config `cfg`'s run starts that hold a card: every SFT and RL rank, the
    grammar check, the rollout server where one is launched, the evaluation's servers or its
    `hf` process."""
    roles = [f"SFT rank {r}" for r in range(cfg.sft.num_ranks)] + ["SFT grammar check"]
    roles += [f"RL rank {r}" for r in range(cfg.rl.num_ranks)]
    server = cfg.rl.rollout.server_section()
    if server is not None and server.url is None:
        roles.append("RL rollout server")
    if cfg.eval.engine == "hf":
        roles.append("evaluation (hf)")
    elif cfg.eval.endpoint is None:
        roles.append("evaluation server")
    return tuple(roles)


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(summary, indent=1, default=str))
