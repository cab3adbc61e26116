"""`sft.seed`: several cold-start SFT seeds from one base (#46 item 1)."""

from __future__ import annotations

from pathlib import Path

from paravt_core.config import load_config
from paravt_core.refs import ArtifactRef
from paravt_core.sft.stage import run_dir, seeded, unseeded

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "conf/pipeline/reproduce.yaml")


def test_sft_seed_seeds_sft_alone_and_leaves_the_base_to_run_seed(tmp_path):
    base = load_config(CONFIG, [f"run.output_dir={tmp_path}"])
    other = load_config(CONFIG, [f"run.output_dir={tmp_path}", "sft.seed=1"])
    assert seeded(base) is base and unseeded(base) is base
    assert seeded(other).run.seed == 1 and other.run.seed == base.run.seed == 0
    # what trains the base (the miniature's pretraining) sees the config without the SFT seed: same keys
    assert unseeded(other) == base and unseeded(other).section_hash() == base.section_hash()
    model = ArtifactRef(kind="base_model", path=tmp_path / "m", sha256="a" * 64)
    data = ArtifactRef(kind="sft_data", path=tmp_path / "d", sha256="b" * 64)
    assert run_dir(other, model, data) != run_dir(base, model, data)  # its own SFT run folder
    assert run_dir(load_config(CONFIG, [f"run.output_dir={tmp_path}", "sft.seed=0"]), model, data) != \
        run_dir(base, model, data)  # set is set: an explicit seed is its own run, whatever its value


def test_own_token_openings_are_refused_beside_the_reading_phases_transcripts(tmp_path):
    import pytest

    from paravt_core.config import ConfigError

    with pytest.raises(ConfigError, match="reading_transcripts"):
        load_config(CONFIG, [f"run.output_dir={tmp_path}", "data.synth.crop_opening=own_token",
                             "model.pretrain.reading_transcripts=0.5"])
    assert load_config(CONFIG, ["data.synth.crop_opening=own_token"]).data.synth.crop_opening == "own_token"
