"""The rollout engines' records: one `RolloutEngineSpec` per `rl.rollout.engine` (issue #63 item 1).

A record names what every reader of the engine needs, so none of them compares the engine's
name to a literal (tests/unit/test_rollout_engines.py holds that):

- the config (`config.RolloutConfig`): which names `rl.rollout.engine` accepts, and whether the
  engine has a server section `rl.rollout.<name>` (its `url`, `placement`, `gpus`: where the
  server runs);
- the RL ranks (`rl/rollout_engine.py`): `check`, which refuses before any worker starts a
  config that cannot run here, and `backend`, which builds a rank's `RolloutBackend` (launching
  or connecting to the server, holding a launched one in the device ledger);
- the memory plan (`plan.py`): `plan`, the engine's rows and problems, and `copy_per_rank`,
  whether every training rank also holds a whole bf16 copy of the policy to generate with;
- the pre-flight (`preflight.py`): `preflight`, the checks of what the engine needs installed;
- the rehearsal (`rehearsal.py`) and the cache identity (`cache_identity.py`): `server`;
- the config's check of `rl.overlap` (`rl/overlap.py`): `overlaps`.

The config holds the records beside the server sections they name (`config.py`, the rollout
section), registered with `register_rollout_engine`. The callables live above the config's
layer (the agent, the RL stage, the plan), so a record names them by module path,
"package.module:function", resolved when called, as torchtune's `_component_` does: this module
and the config import nothing of theirs. A new engine puts its callables in a module of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Hook = Literal["backend", "plan", "check", "preflight"]


class ServerSection(Protocol):
    """What every reader of a server engine's section (`rl.rollout.<name>`) takes from it: where the
    server runs. The section holds the engine's own knobs besides."""

    url: str | None  # a running server to connect to; None: rank 0 launches one
    placement: str  # "colocated" on the training GPUs, or "split" on `gpus` of its own
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class RolloutEngineSpec:
    """One rollout engine; each callable is "package.module:function" (module docstring).

    Attributes:
        name: the value of `rl.rollout.engine`.
        backend: `(cfg, init_model, processor, device, rank, world, staging_dir, init_sha256)` ->
            this rank's `rl.rollout_engine.RolloutBackend`.
        plan: `(cfg, shape, budget, gpu_bytes)` -> (the memory plan's rollout rows, its problems).
        check: `(cfg)` -> None, raising `ConfigError` when the engine cannot run here; None: always can.
        preflight: `(cfg, probes)` -> the pre-flight's `Check`s of what it needs installed.
        server: the engine talks to a server whose settings are `rl.rollout.<name>` (a `ServerSection`):
            a launched one holds cards of its own (the device ledger, the rehearsal) and where it
            runs is no part of an RL run's identity.
        copy_per_rank: every training rank holds a whole bf16 copy of the policy to generate with.
        overlaps: its backend can generate the next step's batch while the trainer trains
            (`rl.overlap: 1`, `rl/overlap.py`); the config refuses the knob on any other engine.
        releases_colocated: a colocated server gives its GPU memory to the training passes between
            rollouts, so it cannot generate beside them: `rl.overlap: 1` needs the split placement.
    """

    name: str
    backend: str
    plan: str
    check: str | None = None
    preflight: str | None = None
    server: bool = False
    copy_per_rank: bool = False
    overlaps: bool = False
    releases_colocated: bool = False

    def call(self, hook: Hook, *args: Any) -> Any:
        """Call the record's `hook` ("backend", "plan", "check", "preflight") with `args`; an unset
        optional hook does nothing (None; an empty list for `preflight`)."""
        ref = getattr(self, hook)
        if ref is None:
            return [] if hook == "preflight" else None
        return resolve(ref)(*args)


ROLLOUT_ENGINES: dict[str, RolloutEngineSpec] = {}


def register_rollout_engine(spec: RolloutEngineSpec) -> RolloutEngineSpec:
    """Add `spec` to the records; another record under a registered name is refused (the same
    record again, as a reloaded config registers it, is kept)."""
    if ROLLOUT_ENGINES.get(spec.name, spec) != spec:
        raise ValueError(f"rollout engine {spec.name!r} is registered twice")
    ROLLOUT_ENGINES[spec.name] = spec
    return spec


def rollout_engine_spec(name: str) -> RolloutEngineSpec:
    """The record of engine `name` (the config has refused any other name before)."""
    return ROLLOUT_ENGINES[name]


def server_engines() -> tuple[str, ...]:
    """The engines with a server section `rl.rollout.<name>`, in the order registered."""
    return tuple(name for name, spec in ROLLOUT_ENGINES.items() if spec.server)


def resolve(ref: str) -> Callable[..., Any]:
    """The function "package.module:function" names."""
    module, _, name = ref.partition(":")
    if not module or not name:
        raise ValueError(f"{ref!r} is not 'package.module:function'")
    return getattr(importlib.import_module(module), name)
