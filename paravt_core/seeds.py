"""The range of a seed every stage can take, end to end (#61 item 5).

A seed reaches numpy (`np.random.default_rng([seed, epoch])`, SFT's data order: non-negative
only), torch (`torch.manual_seed`: below 2**64) and, through the RL rollout's derivation,
`torch.manual_seed` again as `(seed * 100_003 + step * 997 + rank) * 1_000_003 + 2 * turn + 1`
(`rl.replay.sampler_seed`, `agent.rollout`), which the vLLM and SGLang servers also take and keep
below 2**63. `MAX_SEED` = 2**26 - 1 keeps that product below 2**63 for a million steps on a
thousand ranks; a seed outside [0, MAX_SEED] is refused when its config loads, naming the key,
instead of crashing a rank after the data stage.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MAX_SEED = (1 << 26) - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


def seed_argument(text: str) -> int:
    """argparse `type=` for a `--seed` flag: a whole number in [0, MAX_SEED], else a usage error."""
    import argparse

    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed: give a whole number from 0 to {MAX_SEED:,}")
    return seed
