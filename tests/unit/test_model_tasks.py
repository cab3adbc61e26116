"""The miniature plugs into the full pipeline's base-model and SFT tasks, which never call it
themselves: a full-pipeline flow refuses the miniature's pretraining instead of dropping it, and
the extra shard the reproduction passes names the SFT run's folder and cache key."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.refs import ArtifactRef
from paravt_core.sft import stage as sft_stage
from paravt_core.sft.stage import ExtraShard
from tasks import model as model_tasks
from tasks import sft as sft_tasks

REPO = Path(__file__).resolve().parents[2]
BASE = ArtifactRef(kind="base_model", path=Path("/nowhere/base"), sha256="b" * 64)
DATA = ArtifactRef(kind="sft_data", path=Path("/nowhere/data"), sha256="d" * 64)


@pytest.fixture()
def built(monkeypatch) -> list:
    """`base_model` replaced by one that records its calls (no Prefect run, no model built)."""
    calls = []
    monkeypatch.setattr(model_tasks, "base_model", lambda cfg: calls.append(cfg) or BASE)
    return calls


def test_a_full_pipeline_flow_refuses_the_miniature_s_pretraining_before_building_anything(tmp_path, built):
    cfg = load_config(REPO / "conf/pipeline/reproduce.yaml", [f"run.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"model\.pretrain\.enabled.*paravt reproduce"):
        model_tasks.base_stage(cfg)
    assert built == []


def test_the_pretraining_the_reproduction_plugs_in_trains_the_built_base(tmp_path, built):
    cfg = load_config(REPO / "conf/pipeline/reproduce.yaml", [f"run.output_dir={tmp_path}"])
    pretrained = BASE.model_copy(update={"sha256": "p" * 64})
    seen = []
    assert model_tasks.base_stage(cfg, lambda c, base: seen.append(base) or pretrained) == pretrained
    assert seen == [BASE] and len(built) == 1
    tiny = load_config(REPO / "conf/pipeline/tiny.yaml", [f"run.output_dir={tmp_path}"])
    assert model_tasks.base_stage(tiny) == BASE  # no pretraining configured: the built base as it is


def test_the_extra_shard_names_the_sft_run_s_folder_and_key(tmp_path, monkeypatch):
    monkeypatch.setattr(sft_tasks, "stage_key", lambda *parts, output, intact: (parts, output))
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [f"run.output_dir={tmp_path}"])
    extra = ExtraShard("replay=4", "replay.parquet", lambda path, log_line: path)
    plain = sft_tasks._sft_key(None, {"cfg": cfg, "base": BASE, "sft_data": DATA})
    with_extra = sft_tasks._sft_key(None, {"cfg": cfg, "base": BASE, "sft_data": DATA, "extra": extra})
    assert plain[1] == sft_stage.run_dir(cfg, BASE, DATA) / "model"
    assert with_extra[1] == sft_stage.run_dir(cfg, BASE, DATA, extra=extra) / "model" != plain[1]
