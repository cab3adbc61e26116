"""A generated long-video world in the ParaVT and benchmark formats (`paravt synth`).

Modules: `config` (sizes), `world` (videos and their events: the ground truth),
`glyphs` and `render` (frames and mp4), `questions`, `prompts` and `traces` (questions
and teacher traces in the SPEC §2 grammar), `paravt` (ParaVT-Parquet rows and
ParaVT-Source zips, SPEC §8), `benchmarks` (the seven SPEC §7 splits in the real row
layouts), `archives` and `hub` (deterministic zips, the local hub cache) and `generate`
(the entry point, `generate_world`).
"""

from paravt_core.data.synth.config import SynthConfig
from paravt_core.data.synth.generate import PARQUET_REPO, SOURCE_REPO, SynthWorld, generate_world

__all__ = ["PARQUET_REPO", "SOURCE_REPO", "SynthConfig", "SynthWorld", "generate_world"]
