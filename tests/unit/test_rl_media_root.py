"""An RL row's prompt ids, and so gating's K (SPEC §5), depend on its data, not on its
run.output_dir (issue #66 follow-up): a row given another run's data bundle (a `RowSpec`
whose config names a new output folder) keys its videos relative to the media folder of the
data stage that wrote the data, as the row run in that data's own folder does."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from paravt_core.config import load_config
from paravt_core.refs import ArtifactRef, content_hash
from paravt_core.rl.data import read_rl_prompts
from paravt_core.rl.schedule import step_plan
from paravt_core.rl.stage import make_job

REPO = Path(__file__).resolve().parents[2]
INIT = ArtifactRef(kind="sft_model", path=Path("/no/sft-model"), sha256="0" * 64)


def _data_stage(out: Path, tables: str = "materialized") -> ArtifactRef:
    """The RL folder a data stage with run.output_dir `out` leaves: six rows whose videos are
    absolute file:// URLs under `<out>/data/media` (as materialize writes them)."""
    rows = []
    for i in range(6):
        video = out / "data" / "media" / "paravt" / f"clip{i % 3}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        video.write_bytes(f"video {i % 3}".encode())
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. red\nB. blue"
        rows.append({"prompt": [{"role": "user", "content": question}], "videos": [{"video": video.as_uri()}],
                     "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})})
    folder = out / "data" / tables / "rl"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "paravt_rl.parquet")
    return ArtifactRef(kind="rl_data", path=folder.resolve(), sha256=content_hash(folder))


def _draws(out: Path, rl_data: ArtifactRef) -> list[tuple[str, str, int | None]]:
    """(prompt id, video key, K) of every prompt drawn in the first six steps of the paragrpo row
    whose config names `out`, trained on `rl_data`, as its workers read them from the job."""
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [f"run.output_dir={out}", "rl.prompts_per_step=2",
                                                         "mlflow.enabled=false"], rl_row=REPO / "conf/rl/paragrpo.yaml")
    job = make_job(cfg, INIT, rl_data, with_mlflow=False)
    prompts = read_rl_prompts(job.data_files, cfg.rl.question_types, job.media_root)
    return [(p.prompt.prompt_id, p.video_key, p.prompt.nframes)
            for step in range(6) for p in step_plan(prompts, cfg, step, 0, 1)[0]]


def test_a_row_in_a_new_output_folder_draws_as_in_the_data_s_own_folder(tmp_path):
    data = _data_stage(tmp_path / "first")
    own = _draws(tmp_path / "first", data)
    assert {key for _, key, _ in own} == {"paravt/clip0.mp4", "paravt/clip1.mp4", "paravt/clip2.mp4"}
    assert _draws(tmp_path / "reuses-first", data) == own


def test_the_same_rows_under_two_output_folders_draw_alike_materialized_or_validated(tmp_path):
    first = _draws(tmp_path / "a", _data_stage(tmp_path / "a"))
    assert _draws(tmp_path / "b", _data_stage(tmp_path / "b")) == first
    assert _draws(tmp_path / "c", _data_stage(tmp_path / "v", "validated")) == first


def test_rl_data_laid_out_otherwise_is_keyed_under_the_config_s_media_folder(tmp_path):
    data = _data_stage(tmp_path / "run")
    elsewhere = tmp_path / "run" / "data" / "handmade"
    (tmp_path / "run" / "data" / "materialized" / "rl").rename(elsewhere)
    moved = ArtifactRef(kind="rl_data", path=elsewhere.resolve(), sha256=data.sha256)
    assert {key for _, key, _ in _draws(tmp_path / "run", moved)} == {"paravt/clip0.mp4", "paravt/clip1.mp4",
                                                                      "paravt/clip2.mp4"}
