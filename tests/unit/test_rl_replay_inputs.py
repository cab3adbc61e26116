"""`paravt rl-replay` refuses a log, job or checkpoint it cannot trust, naming the file (#48 item 5).

Before this, a truncated, empty or binary draws log or a damaged checkpoint ended in a
traceback and exit 1 ("rollouts differ"); a log copied to another step's name was replayed
as that step; a log whose `video` was rewritten still replayed "identical". The checks run
before any model is loaded, so these tests need none: the replay of an intact log is
`tests/integration/test_rl_replay.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from paravt_core.cli import main
from paravt_core.config import load_config
from paravt_core.rl.data import read_rl_prompts
from paravt_core.rl.job import RLJob
from paravt_core.rl.replay import PromptDraw, StepDraws, draws_path, sampler_seed, write_draws
from paravt_core.rl.schedule import step_plan

REPO = Path(__file__).resolve().parents[2]


def _run_dir(root: Path) -> Path:
    """An RL run folder as the stage leaves it after 2 steps: job.json, the RL shard (6 prompts,
    2 per step, one video each), both steps' draws logs and the checkpoint after step 1. Its
    init model does not exist: a replay that gets past the checks stops there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    media = root / "data" / "media"
    rows = []
    for i in range(6):
        video = media / f"clip{i}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        video.write_bytes(b"not decoded by these tests")
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. red\nB. blue"
        rows.append({"prompt": [{"role": "user", "content": question}], "videos": [{"video": video.as_uri()}],
                     "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})})
    shard = root / "data" / "rl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), shard)
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={root}", "rl.prompts_per_step=2", "rl.gating.choices=[2,3,4]", "rl.zero_stage=0"],
        rl_row=REPO / "conf/rl/paragrpo.yaml")
    run = root / "rl" / "paragrpo-0"
    job = RLJob(config=cfg, init_model=root / "no-model", init_model_sha256="0" * 64, data_files=[shard],
                media_root=media, data_sha256="0" * 64, out_dir=run, tracking_uri=None, mlflow_run_id=None,
                git_revision="test")
    run.mkdir(parents=True)
    (run / "job.json").write_text(job.model_dump_json())
    prompts = read_rl_prompts([shard], media_root=media)
    for step in (1, 2):
        plan, epoch = step_plan(prompts, cfg, step - 1, 0, 1)
        write_draws(run, StepDraws(
            step=step, rank=0, world=1, epoch=epoch, sampler_seed=sampler_seed(cfg.run.seed, step - 1, 0),
            weight_version=step - 1, torch_threads=1, engine=cfg.rl.rollout.engine, rollout_sha256="ab" * 32,
            prompts=[PromptDraw(prompt_id=p.prompt.prompt_id, video=p.video_key, nframes=p.prompt.nframes)
                     for p in plan]))
    _checkpoint(run / "checkpoints", 1)
    return run


def _checkpoint(folder: Path, step: int) -> Path:
    from paravt_core.dist.checkpoints import write_checkpoint_manifest

    tag = folder / f"step{step:07d}"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.full((64, 64), float(step))}, "step": step}, tag / "mp_rank_00_model_states.pt")
    torch.save({"m": torch.zeros(64, 64)}, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    write_checkpoint_manifest(tag)
    (folder / "latest").write_text(tag.name)
    return tag


def _replay(run: Path, step: int, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["rl-replay", "--run-dir", str(run), "--step", str(step)])
    return code, capsys.readouterr().err


def _edit(run: Path, step: int, change) -> None:
    path = draws_path(run, step, 0)
    log = json.loads(path.read_text())
    change(log)
    path.write_text(json.dumps(log))


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    return _run_dir(tmp_path)


def test_an_intact_log_passes_the_checks_and_stops_only_at_the_missing_model(run, capsys):
    for step in (1, 2):  # step 2 also reads the checkpoint after step 1
        code, err = _replay(run, step, capsys)
        assert code == 2 and "the run's init model is not whole" in err and "no-model" in err


@pytest.mark.parametrize("content", [b"", b'{"step": 1, "rank": 0, "wor', b"\x00\x9f\xff\x10PK\x03\x04"],
                         ids=["empty", "truncated", "binary"])
def test_an_unreadable_draws_log_exits_2_naming_the_file(run, capsys, content):
    draws_path(run, 1, 0).write_bytes(content)
    code, err = _replay(run, 1, capsys)
    assert code == 2
    assert f"{draws_path(run, 1, 0)} is not a draws log as the RL stage writes it" in err and "damaged" in err


def test_a_log_filed_under_another_step_is_refused(run, capsys):
    shutil.copy(draws_path(run, 1, 0), draws_path(run, 2, 0))
    code, err = _replay(run, 2, capsys)
    assert code == 2 and "it logs step 1 rank 0, but it is filed as step 2 rank 0" in err


def _rewrite_video(log):
    log["prompts"][0]["video"] = "elsewhere/other.mp4"


def _rewrite_k(log):
    log["prompts"][0]["nframes"] = {2: 3, 3: 4, 4: 2}[log["prompts"][0]["nframes"]]


def _swap_prompts(log):
    log["prompts"].reverse()  # the step's prompts, in another order than they were drawn (and rolled out)


@pytest.mark.parametrize(("change", "message"), [
    (_rewrite_video, "logs video 'elsewhere/other.mp4', but the job's RL data has 'clip"),
    (_rewrite_k, "logs K="),
    (_swap_prompts, "is not among the prompts this step draws"),
    (lambda log: log.update(sampler_seed=log["sampler_seed"] + 1), "sampler_seed is"),
    (lambda log: log.update(weight_version=0), "weight_version is 0, but step 2 rank 0 of this run has 1"),
    (lambda log: log.update(epoch=7), "epoch is 7"),
    (lambda log: log.update(world=2), "is not among the prompts this step draws"),
    (lambda log: log.update(engine="vllm"), "engine is 'vllm'"),
], ids=["video", "K", "prompt", "seed", "weights", "epoch", "world", "engine"])
def test_a_log_that_disagrees_with_the_run_is_refused_naming_the_field(run, capsys, change, message):
    _edit(run, 2, change)
    code, err = _replay(run, 2, capsys)
    assert code == 2 and str(draws_path(run, 2, 0)) in err and message in err
    assert "the log was edited or belongs to another run" in err


def test_a_damaged_or_replaced_checkpoint_is_refused(run, capsys):
    weights = run / "checkpoints" / "step0000001" / "mp_rank_00_model_states.pt"
    intact = weights.read_bytes()
    damaged = bytearray(intact)
    damaged[len(damaged) // 2] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    code, err = _replay(run, 2, capsys)
    assert code == 2 and "the checkpoint of the weights after step 1 is damaged" in err and f"{weights} is corrupted" in err
    other = _checkpoint(run / "elsewhere", 5)  # a whole, valid checkpoint file of other weights
    shutil.copy(other / weights.name, weights)
    code, err = _replay(run, 2, capsys)
    assert code == 2 and f"{weights} changed since it was saved" in err


def test_another_steps_file_copied_in_with_the_manifest_deleted_is_named(run, capsys):
    """#61: a step's .pt swapped into another step with its manifest deleted passed the checks,
    and the replay said "DIFFERENT" instead of naming the file."""
    from paravt_core.dist.checkpoints import CHECKPOINT_MANIFEST

    tag = run / "checkpoints" / "step0000001"
    other = _checkpoint(run / "elsewhere", 3)
    shutil.copy(other / "mp_rank_00_model_states.pt", tag / "mp_rank_00_model_states.pt")
    (tag / CHECKPOINT_MANIFEST).unlink()
    code, err = _replay(run, 2, capsys)
    assert code == 2 and f"{tag / 'mp_rank_00_model_states.pt'} holds the state after step 3, not step 1" in err
    shutil.copy(other / "zero_pp_rank_0_mp_rank_00_optim_states.pt", tag)  # a file that records no step
    _checkpoint(run / "checkpoints", 2)  # a sibling with its manifest
    torch.save({"module": {}, "step": 1}, tag / "mp_rank_00_model_states.pt")
    code, err = _replay(run, 2, capsys)
    assert code == 2 and f"{tag / CHECKPOINT_MANIFEST} is missing (the run's other checkpoints have theirs)" in err


def test_an_unreadable_job_exits_2_naming_it(run, capsys):
    (run / "job.json").write_text('{"config": ')
    code, err = _replay(run, 1, capsys)
    assert code == 2 and f"{run / 'job.json'} is not a readable RL job" in err
