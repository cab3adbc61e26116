"""The RL step's and the evaluator's speed-ups change no result (issue #45, docs/speed.md).

Two short PARA-GRPO runs on the tiny model from one seed, one with the speed-ups (the hf
engine's preallocated key/value cache, `model.vision_attention: batched` in the policy,
the reference and the rollout engine) and one with them off (transformers' DynamicCache,
per-frame vision attention: the code before #45), give the same metrics at every step and
the same weights bit for bit; greedy evaluation-style episodes give the same tokens. The
main agent's first turn is scripted to two crop calls (the random model never calls a tool)
so crops, sub-agents and their training run too.

Why not a golden recorded from the old commit: float results of the same code differ between
CPUs (kernel choice), so a recorded hash would fail on another machine for no fault of the
code. `bench/rl_step.py` compares against the old commit itself, side by side, on one machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from transformers.cache_utils import DynamicCache

from paravt_core.agent.engine import Generation
from paravt_core.config import load_config
from paravt_core.dist import free_port
from paravt_core.refs import ArtifactRef, content_hash

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
CALL = '<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "v.mp4", "start_time": {}, "end_time": {}}}}}</tool_call>'
FIRST_TURN = "<think>\nlook</think>\n" + CALL.format(1, 5) + CALL.format(6, 11)


class ScriptedFirstTurn:
    """The main agent's first turn is FIRST_TURN; sub-agents and later turns run on the model."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.first = tokenizer(FIRST_TURN, add_special_tokens=False)["input_ids"] + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.assistant = tokenizer("<|im_start|>assistant", add_special_tokens=False)["input_ids"]

    def _first(self, request) -> bool:
        ids, n = request.prompt_ids, len(self.assistant)
        turns = sum(ids[i:i + n] == self.assistant for i in range(len(ids) - n + 1))
        return turns == 1 and "concise, factual summary" not in self.tokenizer.decode(ids)

    def generate(self, requests, params):
        first = [self._first(r) for r in requests]
        if not any(first):
            return self.engine.generate(requests, params)
        assert all(first), "episodes of a batch are in lock step"
        return [Generation(list(self.first), [-1.0] * len(self.first), "stop") for _ in requests]

    def update_weights(self, state_dict) -> None:
        self.engine.update_weights(state_dict)


@pytest.fixture()
def rl_inputs(tmp_path: Path, tiny_model_dir: Path, short_video: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "rl"
    data.mkdir()
    rows = []
    for i in range(4):
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. red\nB. blue\nAnswer with the option letter only."
        rows.append({"prompt": [{"role": "system", "content": "Call crop_video to look closer."},
                                {"role": "user", "content": question}],
                     "videos": [{"video": f"file://{short_video}"}],
                     "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})})
    pq.write_table(pa.Table.from_pylist(rows), data / "rl.parquet")
    init = ArtifactRef(kind="sft_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    return init, ArtifactRef(kind="rl_data", path=data, sha256=content_hash(data))


def _config(out: Path, vision_attention: str):
    # conf/pipeline/reproduce.yaml's RL (gating, crops, sub-agents trained, KL), smaller.
    return load_config(REPO / "conf/pipeline/reproduce.yaml", [
        f"run.output_dir={out}", "model.pretrain.enabled=false", "model.pretrain.sft_replay_rows=0",
        f"model.vision_attention={vision_attention}", "rl.prompts_per_step=2", "rl.group_size=2",
        "rl.micro_batch_size=3", "rl.rollout.max_new_tokens=6", "rl.rollout.subagent_max_new_tokens=5",
        "rl.learning_rate=0.01", "video.crop_max_frames=4", "video.max_pixels=3072"])


def _two_steps(tmp: Path, init, rl_data, vision_attention: str, monkeypatch) -> tuple[list[dict], str, object]:
    from paravt_core.dist import shutdown_distributed
    from paravt_core.rl import stage
    from paravt_core.rl.worker import Trainer

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    job = stage.make_job(_config(tmp, vision_attention), init, rl_data, with_mlflow=False)
    try:
        trainer = Trainer(job.model_copy(update={"steps_only": True}))
        trainer.engine = ScriptedFirstTurn(trainer.engine, trainer.processor.tokenizer)
        rows = [{k: v for k, v in trainer.train_step(step).items() if not k.startswith("time_")} for step in (0, 1)]
    finally:
        shutdown_distributed()
    state = trainer.policy.module.state_dict()
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode() + state[name].detach().contiguous().numpy().tobytes())
    return rows, digest.hexdigest(), trainer


def _is_batched(model) -> bool:
    from paravt_core.model.vision_attention import _batched_forward

    attention = model.model.visual.blocks[0].attn
    return getattr(attention.forward, "__func__", None) is _batched_forward


def test_two_rl_steps_are_the_same_with_and_without_the_speedups(rl_inputs, tmp_path, monkeypatch):
    from paravt_core.agent import hf_engine

    init, rl_data = rl_inputs
    fast_rows, fast_weights, fast = _two_steps(tmp_path / "fast", init, rl_data, "batched", monkeypatch)
    # The policy, the reference and the rollout engine all took the batched vision attention.
    assert _is_batched(fast.policy.module) and _is_batched(fast.ref_model) and _is_batched(fast.engine.engine.model)
    assert fast_rows[0]["kappa"] == 2.0 and fast_rows[0]["trajectories"] > 4  # crops and sub-agents ran
    with monkeypatch.context() as patched:
        patched.setattr(hf_engine, "PreallocatedCache", lambda layers, capacity: DynamicCache())
        slow_rows, slow_weights, slow = _two_steps(tmp_path / "slow", init, rl_data, "per_item", monkeypatch)
    assert not _is_batched(slow.policy.module)
    assert fast_rows == slow_rows
    assert fast_weights == slow_weights


def test_greedy_evaluation_episodes_are_the_same_with_and_without_the_speedups(rl_inputs, tiny_processor,
                                                                                 monkeypatch):
    from paravt_core.agent import hf_engine
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.eval import stage as eval_stage
    from paravt_core.rl import stage
    from paravt_core.rl.data import read_rl_prompts

    init, rl_data = rl_inputs
    model = ArtifactRef(kind="model", path=init.path, sha256=init.sha256)
    cfg = _config(Path("unused"), "batched")
    prompts = [p.prompt for p in read_rl_prompts(stage.rl_shards(rl_data))]

    def episodes(vision_attention: str):
        engine, processor = eval_stage.hf_engine(model, "float32", vision_attention=vision_attention)
        assert _is_batched(engine.model) == (vision_attention == "batched")
        main = ScriptedFirstTurn(engine, processor.tokenizer)
        return run_episodes(main, processor, prompts, cfg.rl.rollout, cfg.video, temperature=0.0)

    fast = episodes("batched")
    with monkeypatch.context() as patched:
        patched.setattr(hf_engine, "PreallocatedCache", lambda layers, capacity: DynamicCache())
        slow = episodes("per_item")
    assert all(e.tool_calls == 2 for e in fast)
    assert [e.token_ids.tolist() for e in fast] == [e.token_ids.tolist() for e in slow]
    assert [e.old_logprobs.tolist() for e in fast] == [e.old_logprobs.tolist() for e in slow]
