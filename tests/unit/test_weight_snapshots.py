"""The rollout server's weight snapshots (issue #44 item 8): written tensor by tensor from a
stream and bit for bit the weights given, staged in /dev/shm only when it fits, and never left
there after a run."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from paravt_core.agent import weight_snapshots as W
from paravt_core.rl.weight_push import GatheredWeights
from tests.http_stand_in import StandIn

REPO = Path(__file__).resolve().parents[2]
MEDIA = {"<|image_pad|>": 9, "<|vision_start|>": 7, "<|vision_end|>": 8}


def _assert_same(loaded: dict, expected: dict) -> None:
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_a_snapshot_holds_the_models_state_dict_bit_for_bit(tmp_path, tiny_model):
    state = tiny_model.state_dict()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    final = W.write_weight_snapshot(tmp_path / "weights", 1, tmp_path / "model", state)
    assert final == tmp_path / "weights" / "v1" and (final / "config.json").is_file()
    _assert_same(load_file(str(final / "model.safetensors")), state)
    with safe_open(str(final / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    # the served dtype: the cast the snapshots always had (fp32 policy, bf16 server)
    bf16 = W.write_weight_snapshot(tmp_path / "weights", 2, tmp_path / "model", state, torch.bfloat16)
    _assert_same(load_file(str(bf16 / "model.safetensors")), {n: t.to(torch.bfloat16) for n, t in state.items()})


def test_mixed_dtypes_shared_storage_and_scalars_are_written_as_they_are(tmp_path):
    embed = torch.randn(5, 3)
    state = {"a.scalar": torch.tensor(2.5, dtype=torch.bfloat16), "b.embed": embed, "c.tied": embed,
             "d.steps": torch.arange(7), "e.mask": torch.tensor([True, False]), "f.empty": torch.zeros(0, 4),
             "g.half": torch.randn(3, dtype=torch.float16), "h.strided": torch.randn(4, 6)[:, ::2]}
    W.write_safetensors(tmp_path / "w.safetensors", W.MappingStream(state))
    _assert_same(load_file(str(tmp_path / "w.safetensors")), state)


def test_gathered_weights_of_a_whole_model_are_its_state_dict_and_only_a_keeping_rank_gets_them(tiny_model):
    engine = SimpleNamespace(module=tiny_model)
    kept = GatheredWeights(engine, zero_stage=0, keep=True)
    state = tiny_model.state_dict()
    assert sorted(s.name for s in kept.specs) == sorted(state)
    _assert_same(dict(kept), state)
    assert list(GatheredWeights(engine, zero_stage=0, keep=False)) == []


class CountingStream:
    """A stream announcing two tensors whose second is not the one announced."""

    def __init__(self):
        self.specs = [W.TensorSpec("a", (2,), torch.float32), W.TensorSpec("b", (3,), torch.float32)]
        self.yielded = 0

    def __iter__(self):
        for name, shape in (("a", (2,)), ("c", (3,)), ("d", (1,))):
            self.yielded += 1
            yield name, torch.zeros(shape)


def test_a_stream_that_breaks_its_specs_is_refused_and_still_iterated_to_its_end(tmp_path):
    stream = CountingStream()
    with pytest.raises(ValueError, match=r"expected b \(3,\) next, got c \(3,\)"):
        W.write_weight_snapshot(tmp_path / "weights", 1, tmp_path, stream)
    assert stream.yielded == 3  # the other ranks' gathers of the rest are all joined
    assert not (tmp_path / "weights" / "v1").exists()


def test_a_rank_that_does_not_push_joins_the_stream_and_keeps_nothing():
    from paravt_core.rl.rollout_engine import RolloutBackend

    class Refuses:
        def update_weights(self, weights):
            raise AssertionError("only the pushing rank gives the engine weights")

    stream = CountingStream()
    RolloutBackend(Refuses(), pushes_weights=False, served=True).update_weights(stream, 1)
    assert stream.yielded == 3


@pytest.fixture
def fake_shm(tmp_path, monkeypatch):
    """A /dev/shm stand-in whose free space and the host's available memory the test sets."""
    root = tmp_path / "shm"
    root.mkdir()
    space = {"free": 100 << 30, "available": 100 << 30}
    monkeypatch.setattr(W, "shm_free_bytes", lambda path: space["free"] if path == root else 0)
    monkeypatch.setattr(W, "mem_available_bytes", lambda: space["available"])
    return root, space


def test_a_snapshot_goes_to_shm_only_when_shm_and_memory_both_hold_it_with_a_margin(tmp_path, fake_shm):
    root, space = fake_shm
    lines: list[str] = []
    stager = W.SnapshotStager(tmp_path / "weights", W.shm_staging_dir(tmp_path / "weights", root), log=lines.append)
    size = 8 << 30
    assert stager.choose(size)[0] == stager.shm_dir
    space["free"] = size + (1 << 30) - 1  # short of the 1 GiB margin
    where, why = stager.choose(size)
    assert where == tmp_path / "weights" and "/dev/shm has 9.7 GB free" in why and "9.7 GB needed" in why
    space["free"], space["available"] = 100 << 30, size  # tmpfs room, but not the memory behind it
    assert stager.choose(size)[0] == tmp_path / "weights"
    space["available"] = 100 << 30
    assert stager.choose(100 << 30)[0] == tmp_path / "weights"  # the margin grows with the snapshot (5 %)
    # a server behind a url may not share this machine's /dev/shm
    assert W.SnapshotStager(tmp_path / "weights", None).choose(size)[0] == tmp_path / "weights"


def test_versions_continue_over_both_folders_and_only_the_loaded_one_stays(tmp_path, fake_shm):
    root, space = fake_shm
    lines: list[str] = []
    shm_dir = W.shm_staging_dir(tmp_path / "weights", root)
    stager = W.SnapshotStager(tmp_path / "weights", shm_dir, log=lines.append)
    first = stager.write(tmp_path, {"w": torch.ones(2)})
    assert first == shm_dir / "v1" and f"written to {first}" in lines[-1] and "/dev/shm has" in lines[-1]
    stager.loaded(first)
    space["free"] = 0
    second = stager.write(tmp_path, {"w": torch.zeros(2)})
    assert second == tmp_path / "weights" / "v2" and "GB needed" in lines[-1]
    stager.loaded(second)
    assert not first.exists() and second.is_dir()
    space["free"] = 100 << 30
    again = W.SnapshotStager(tmp_path / "weights", shm_dir, log=lines.append)  # a resumed trainer
    third = again.write(tmp_path, {"w": torch.ones(2)})
    assert third == shm_dir / "v3"
    again.loaded(third)
    assert not second.exists()
    again.release()
    assert not shm_dir.exists()


@pytest.mark.skipif(not W.SHM_DIR.is_dir(), reason="needs a /dev/shm")
def test_a_launched_servers_snapshots_go_to_dev_shm_and_are_gone_when_the_backend_closes(tmp_path):
    """The real /dev/shm: the server is told an absolute path there, and nothing is left in it."""
    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.rl.rollout_engine import RolloutBackend

    staging = tmp_path / "weights"
    shm_dir = W.shm_staging_dir(staging)
    if W.shm_free_bytes(W.SHM_DIR) < 2 * W.SHM_MARGIN_BYTES or W.mem_available_bytes() < 2 * W.SHM_MARGIN_BYTES:
        pytest.skip("/dev/shm or host memory too short for the margin on this machine now")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    stand_in = StandIn(lambda path, body: {"results": [None]} if path == "/collective_rpc" else {})
    try:
        engine = VLLMEngine(stand_in.url, tmp_path / "model", staging, MEDIA, shm_dir=shm_dir)
        backend = RolloutBackend(engine, pushes_weights=True, served=True, url=stand_in.url)
        backend.update_weights({"w": torch.ones(2)}, 0)
        backend.update_weights({"w": torch.full((2,), 3.0)}, 1)
        loaded = [b["body"]["kwargs"]["weights_path"] for b in stand_in.bodies if b["path"] == "/collective_rpc"]
        assert loaded == [str(shm_dir / "v1"), str(shm_dir / "v2")]
        assert sorted(p.name for p in shm_dir.iterdir()) == ["v2"]
        _assert_same(load_file(str(shm_dir / "v2" / "model.safetensors")), {"w": torch.full((2,), 3.0)})
        backend.close()
    finally:
        stand_in.close()
        W.release_shm_staging(staging)
    assert not shm_dir.exists() and not any(staging.glob("v*"))


@pytest.mark.skipif(not W.SHM_DIR.is_dir(), reason="needs a /dev/shm")
def test_the_rl_stage_deletes_the_runs_shm_snapshots_whatever_its_workers_did(tmp_path, monkeypatch):
    from paravt_core.config import load_config
    from paravt_core.rl import stage

    out = tmp_path / "run"
    monkeypatch.setattr(stage, "run_dir", lambda cfg, init, rl_data: out)
    shm_dir = W.shm_staging_dir(out / "rollout_weights")

    def crashed_workers(*args, **kwargs):
        (shm_dir / "v4").mkdir(parents=True)  # what a killed rank 0 leaves behind
        raise RuntimeError("rl_worker.py exited with code -9")

    monkeypatch.setattr(stage, "run_stage_workers", crashed_workers)
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [f"run.output_dir={tmp_path / 'out'}"])
    try:
        with pytest.raises(RuntimeError, match="code -9"):
            stage.run(cfg, None, None)
        assert not shm_dir.exists()
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)


def test_under_zero3_the_stream_names_the_state_dicts_tensors_and_no_transient_buffer(tiny_model, monkeypatch):
    """A rotary embedding's `inv_freq` is a non-persistent buffer: in `named_buffers`, not in the
    state dict. vLLM refused a ZeRO-3 push that named it (`paravt rehearse` of paravt_8b.yaml:
    "There is no module or parameter named 'rotary_emb' in Qwen3LLMModel")."""
    for parameter in tiny_model.parameters():
        monkeypatch.setattr(parameter, "ds_shape", tuple(parameter.shape), raising=False)
    transient = [name for name, _ in tiny_model.named_buffers() if name not in tiny_model.state_dict()]
    assert any(name.endswith("rotary_emb.inv_freq") for name in transient)  # the model has one to leave out
    stream = GatheredWeights(SimpleNamespace(module=tiny_model), zero_stage=3, keep=True)
    assert sorted(s.name for s in stream.specs) == sorted(tiny_model.state_dict())
