"""Resume falls back to the newest intact checkpoint (`paravt_core.dist.checkpoints.resume`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from paravt_core.dist.checkpoints import CheckpointError, checkpoint_damage, resume


class RecordingEngine:
    """Stands in for a DeepSpeed engine: records which tag it was asked to load."""

    def __init__(self):
        self.loaded: list[str | None] = []

    def load_checkpoint(self, folder: str, tag: str | None = None):
        self.loaded.append(tag)
        step = int(tag.removeprefix("step"))
        torch.load(Path(folder) / tag / "mp_rank_00_model_states.pt")  # fails on a damaged file, as DeepSpeed would
        return folder, {"step": step}


def write_checkpoints(folder: Path, steps: list[int], latest: bool = True, exist_ok: bool = False) -> None:
    for step in steps:
        tag = folder / f"step{step:07d}"
        tag.mkdir(parents=True, exist_ok=exist_ok)
        torch.save({"w": torch.full((64, 64), float(step))}, tag / "mp_rank_00_model_states.pt")
        torch.save({"m": torch.zeros(64, 64)}, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    if latest:
        (folder / "latest").write_text(f"step{steps[-1]:07d}")


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path):
    write_checkpoints(tmp_path, [10, 20, 30])
    flip_a_byte(tmp_path / "step0000030" / "mp_rank_00_model_states.pt")
    (tmp_path / "step0000020" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")  # truncated to nothing
    warnings: list[str] = []
    engine = RecordingEngine()
    assert resume(engine, tmp_path, warn=warnings.append) == {"step": 10}
    assert engine.loaded == ["step0000010"]
    (warning,) = warnings
    assert "resuming from" in warning and "step0000010" in warning
    assert "step0000030/mp_rank_00_model_states.pt is corrupted" in warning
    assert "step0000020/zero_pp_rank_0_mp_rank_00_optim_states.pt is not a complete torch file" in warning


def test_an_intact_latest_is_loaded_without_warning_and_newer_unfinished_tags_are_ignored(tmp_path):
    write_checkpoints(tmp_path, [10, 20])
    (tmp_path / "step0000030").mkdir()  # an interrupted save: `latest` still says step 20
    warnings: list[str] = []
    engine = RecordingEngine()
    assert resume(engine, tmp_path, warn=warnings.append) == {"step": 20}
    assert engine.loaded == ["step0000020"] and warnings == []
    assert resume(RecordingEngine(), tmp_path / "absent") == {}


def test_no_intact_checkpoint_names_the_folder_and_the_fix(tmp_path):
    write_checkpoints(tmp_path, [10, 20])
    for tag in ("step0000010", "step0000020"):
        path = tmp_path / tag / "mp_rank_00_model_states.pt"
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"no intact checkpoint in {tmp_path} .* Delete {tmp_path} to start"):
        resume(RecordingEngine(), tmp_path)


def test_checkpoint_damage_needs_model_states(tmp_path):
    (tmp_path / "step0000001").mkdir()
    assert "no *model_states.pt" in checkpoint_damage(tmp_path / "step0000001")


@pytest.mark.parametrize("latest", [b"", b"step00", b"\xff\xfe", b"step0000099"])
def test_a_damaged_latest_file_falls_back_to_the_newest_intact_step(tmp_path, latest: bytes):
    """Issue #33 item 4: an empty or half-written `latest` stopped the stage though intact steps exist."""
    write_checkpoints(tmp_path, [10, 20])
    (tmp_path / "latest").write_bytes(latest)
    warnings: list[str] = []
    engine = RecordingEngine()
    assert resume(engine, tmp_path, warn=warnings.append) == {"step": 20}
    assert engine.loaded == ["step0000020"]
    (warning,) = warnings
    assert f"{tmp_path / 'latest'} (empty, unreadable or naming no step folder)" in warning
    assert (tmp_path / "latest").read_text() == "step0000020"  # repaired for later readers


def test_a_resumed_step_log_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    from paravt_core.dist.checkpoints import trim_step_log

    log = tmp_path / "losses.jsonl"
    log.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "loss": 1.2}\n{"step": 4, "lo')
    trim_step_log(log, 2)
    assert log.read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
    trim_step_log(tmp_path / "absent.jsonl", 5)  # nothing to trim
    assert not (tmp_path / "absent.jsonl").exists()


class SavingEngine(RecordingEngine):
    """Stands in for a DeepSpeed engine's save: writes a tag's files, and `latest` when asked."""

    def save_checkpoint(self, folder: str, tag: str, client_state: dict, save_latest: bool = True):
        write_checkpoints(Path(folder), [int(tag.removeprefix("step"))], latest=save_latest, exist_ok=True)


def test_a_saved_checkpoint_records_its_files_and_a_replaced_file_is_refused(tmp_path):
    """#48 item 5: a checkpoint file swapped for another valid torch file passed every check (its CRCs hold)."""
    from paravt_core.dist.checkpoints import CHECKPOINT_MANIFEST, save

    for step in (10, 20):
        save(SavingEngine(), tmp_path, step, {"step": step})
    assert (tmp_path / "latest").read_text() == "step0000020"
    recorded = json.loads((tmp_path / "step0000020" / CHECKPOINT_MANIFEST).read_text())["files"]
    assert sorted(recorded) == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert checkpoint_damage(tmp_path / "step0000020") is None
    weights = "mp_rank_00_model_states.pt"
    shutil.copy(tmp_path / "step0000010" / weights, tmp_path / "step0000020" / weights)  # intact, but step 10's
    assert checkpoint_damage(tmp_path / "step0000020", checksums=False) is None  # same size: only the sha256 tells
    assert f"step0000020/{weights} changed since it was saved" in checkpoint_damage(tmp_path / "step0000020")
    warnings: list[str] = []
    engine = RecordingEngine()
    assert resume(engine, tmp_path, warn=warnings.append) == {"step": 10}
    assert engine.loaded == ["step0000010"] and "changed since it was saved" in warnings[0]
    (tmp_path / "step0000010" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    assert "missing ['zero_pp_rank_0_mp_rank_00_optim_states.pt']" in checkpoint_damage(tmp_path / "step0000010")
    (tmp_path / "step0000010" / CHECKPOINT_MANIFEST).write_text("{")
    assert "not a readable checkpoint manifest" in checkpoint_damage(tmp_path / "step0000010")


def test_a_tag_is_named_latest_only_once_its_manifest_is_written(tmp_path, monkeypatch):
    from paravt_core.dist import checkpoints

    def interrupted(tag_dir, owner=None):
        raise KeyboardInterrupt  # killed while hashing

    monkeypatch.setattr(checkpoints, "write_checkpoint_manifest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(SavingEngine(), tmp_path, 10, {"step": 10})
    assert not (tmp_path / "latest").exists()
    assert resume(RecordingEngine(), tmp_path) == {}  # nothing finished: the stage starts over


# ----- retention (issue #44 item 9: sft/rl.keep_last) ---------------------------------


def step_folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def test_saving_with_keep_last_keeps_exactly_the_newest_and_resume_loads_the_newest(tmp_path):
    from paravt_core.dist.checkpoints import save

    engine = SavingEngine()
    for step in (2, 4, 6, 8, 10):
        save(engine, tmp_path, step, {"step": step}, keep_last=2, warn=pytest.fail)
        assert step_folders(tmp_path)[-1] == f"step{step:07d}"
        assert len(step_folders(tmp_path)) == min(2, step // 2)
    assert step_folders(tmp_path) == ["step0000008", "step0000010"]
    assert resume(RecordingEngine(), tmp_path) == {"step": 10}


def test_without_keep_last_every_checkpoint_is_kept(tmp_path):
    from paravt_core.dist.checkpoints import save

    for step in (1, 2, 3):
        save(SavingEngine(), tmp_path, step, {"step": step})
    assert step_folders(tmp_path) == ["step0000001", "step0000002", "step0000003"]


def test_nothing_is_pruned_unless_latest_names_the_tag_just_saved(tmp_path):
    from paravt_core.dist.checkpoints import prune_checkpoints

    write_checkpoints(tmp_path, [1, 2, 3])
    (tmp_path / "latest").write_text("step0000002")  # DeepSpeed did not get to write it
    warnings: list[str] = []
    assert prune_checkpoints(tmp_path, 1, saved="step0000003", warn=warnings.append) == []
    assert step_folders(tmp_path) == ["step0000001", "step0000002", "step0000003"]
    assert "not pruning" in warnings[0] and "every checkpoint is kept" in warnings[0]


def test_an_unfinished_newer_tag_is_neither_counted_nor_deleted(tmp_path):
    """A run resumed at step 2 left step 9's half-written folder: it is not one of the kept."""
    from paravt_core.dist.checkpoints import prune_checkpoints

    write_checkpoints(tmp_path, [1, 2, 3])
    (tmp_path / "step0000009").mkdir()
    (tmp_path / "latest").write_text("step0000003")
    assert prune_checkpoints(tmp_path, 2, saved="step0000003") == ["step0000001"]
    assert step_folders(tmp_path) == ["step0000002", "step0000003", "step0000009"]


def test_a_kill_while_pruning_never_leaves_a_partial_step_folder(tmp_path, monkeypatch):
    """The order that makes a crash mid-prune safe: a doomed tag is renamed out of the `step*`
    namespace whole before any of its files goes, so a half-deleted folder is never a resume
    candidate, even when `latest` is damaged too; the next prune finishes the job."""
    import shutil

    from paravt_core.dist import checkpoints

    write_checkpoints(tmp_path, [1, 2, 3])

    def killed_mid_delete(path, *args, **kwargs):
        next(Path(path).glob("*model_states.pt")).unlink()  # one file of the tag gone, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed_mid_delete)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.prune_checkpoints(tmp_path, 1, saved="step0000003")
    for tag in (p for p in tmp_path.glob("step*")):
        assert checkpoint_damage(tag) is None, tag
    (tmp_path / "latest").write_bytes(b"")  # and `latest` lost too: the intact newest is still found
    assert resume(RecordingEngine(), tmp_path, warn=lambda line: None) == {"step": 3}
    monkeypatch.undo()
    checkpoints.prune_checkpoints(tmp_path, 1, saved="step0000003")
    assert step_folders(tmp_path) == ["step0000003"]


# ----- #61 item 4: resume never destroys, and never loads another stage's or run's tag ----


def saved_run(run_dir: Path, steps: list[int], stage: str = "sft") -> Path:
    """`run_dir/checkpoints` with `steps` saved as the trainers save them (manifest with owner, then `latest`)."""
    from paravt_core.dist.checkpoints import save

    checkpoints = run_dir / "checkpoints"
    for step in steps:
        save(SavingEngine(), checkpoints, step, {"step": step}, stage=stage)
    return checkpoints


def test_a_deleted_latest_resumes_the_newest_finished_step_with_a_warning(tmp_path):
    """Before: `latest` missing was taken for "no save ever finished" and SFT restarted from step 0."""
    checkpoints = saved_run(tmp_path / "run", [5, 10])
    (checkpoints / "latest").unlink()
    (checkpoints / "step0000015").mkdir()  # an interrupted save's leftovers: no manifest, never a candidate
    warnings: list[str] = []
    engine = RecordingEngine()
    assert resume(engine, checkpoints, warn=warnings.append, stage="sft") == {"step": 10}
    assert engine.loaded == ["step0000010"]
    (warning,) = warnings
    assert f"resuming from {checkpoints / 'step0000010'}" in warning and "latest (missing)" in warning
    assert (checkpoints / "latest").read_text() == "step0000010"


def test_a_deleted_latest_with_no_intact_finished_step_is_an_error_not_a_fresh_start(tmp_path):
    checkpoints = saved_run(tmp_path / "run", [5])
    (checkpoints / "latest").unlink()
    flip_a_byte(checkpoints / "step0000005" / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError, match=rf"latest \(missing\).*is corrupted.* Delete {checkpoints} to start"):
        resume(RecordingEngine(), checkpoints, stage="sft")


def test_the_manifest_names_the_stage_and_run_that_saved_the_tag(tmp_path):
    from paravt_core.dist.checkpoints import CHECKPOINT_MANIFEST

    checkpoints = saved_run(tmp_path / "sft-run-1", [2], stage="sft")
    saved = json.loads((checkpoints / "step0000002" / CHECKPOINT_MANIFEST).read_text())
    assert saved["stage"] == "sft" and saved["run"] == "sft-run-1" and "mp_rank_00_model_states.pt" in saved["files"]


@pytest.mark.parametrize("other_stage, other_run", [("rl", "run"), ("sft", "another-run")])
def test_latest_naming_another_stages_or_runs_step_falls_back_to_this_runs_older_step(tmp_path, other_stage,
                                                                                     other_run):
    """Before: an RL step folder named by an SFT run's `latest` passed the checks and DeepSpeed
    failed loading it (AttributeError, retried twice)."""
    checkpoints = saved_run(tmp_path / "run", [2])
    foreign = saved_run(tmp_path / "elsewhere" / other_run, [4], stage=other_stage)
    shutil.copytree(foreign / "step0000004", checkpoints / "step0000004")
    (checkpoints / "latest").write_text("step0000004")
    warnings: list[str] = []
    engine = RecordingEngine()
    assert resume(engine, checkpoints, warn=warnings.append, stage="sft") == {"step": 2}
    assert engine.loaded == ["step0000002"]
    assert f"was saved by stage '{other_stage}' of run folder '{other_run}'" in warnings[0]
    assert "not by this sft run ('run')" in warnings[0]


def test_another_stages_step_with_nothing_older_is_refused_naming_it(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    foreign = saved_run(tmp_path / "rl-run", [4], stage="rl")
    checkpoints.mkdir(parents=True)
    shutil.copytree(foreign / "step0000004", checkpoints / "step0000004")
    (checkpoints / "latest").write_text("step0000004")
    with pytest.raises(CheckpointError, match="saved by stage 'rl' of run folder 'rl-run'"):
        resume(RecordingEngine(), checkpoints, stage="sft")


def test_tags_saved_before_manifests_named_their_owner_still_resume(tmp_path):
    from paravt_core.dist.checkpoints import CHECKPOINT_MANIFEST, save

    checkpoints = tmp_path / "run" / "checkpoints"
    save(SavingEngine(), checkpoints, 3, {"step": 3})  # no stage: a manifest of files only, as before #61
    assert "stage" not in json.loads((checkpoints / "step0000003" / CHECKPOINT_MANIFEST).read_text())
    assert resume(RecordingEngine(), checkpoints, stage="sft") == {"step": 3}
