"""The RL step's and the evaluator's speed-ups change no result, or stay within a stated bound
(issue #45, docs/speed.md).

Two short PARA-GRPO runs on the tiny model from one seed, one with the exact speed-ups (the hf
engine's preallocated key/value cache, `model.vision_attention: batched` in the policy,
the reference and the rollout engine, `model.vision_dedupe: no_grad`: a group's shared frames
through the vision tower once in every pass without autograd) and one with them off
(transformers' DynamicCache, per-frame vision attention, no dedupe: the code before #45), give
the same metrics at every step and the same weights bit for bit; greedy evaluation-style
episodes give the same tokens. The main agent's first turn is scripted to two crop calls (the
random model never calls a tool) so crops, sub-agents and their training run too.

The switches that change float rounding (`model.vision_dedupe: always`, `model.patch_embed:
linear`, `model.prefill_attention: causal_rows`) are held to bounds instead: the log-probs of
the step's trajectories under each switch against the exact path (LOGPROB_BOUND), and two RL
steps with all of them on against the exact run (METRIC_BOUND, WEIGHT_BOUND). Measured on the
development machine: log-probs within 1.5e-6 nats, weights apart by 4e-5 of the update (its norm). A real
fault is orders of magnitude above the bounds: a padding key left visible, a row's keys shifted
by one position, or a frame given another frame's features each moved log-probs by more than
1e-2 when planted (docs/speed.md).

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
from paravt_core.dist.launch import free_port
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


EXACT = ["model.vision_attention=batched"]  # and model.vision_dedupe's default, no_grad
BEFORE = ["model.vision_attention=per_item", "model.vision_dedupe=never"]  # the code before #45
ROUNDING = {"vision_dedupe": "always", "patch_embed": "linear", "prefill_attention": "causal_rows"}
LOGPROB_BOUND = 1e-4  # nats, any trained token of the step, one switch or all three
METRIC_BOUND = 1e-3  # relative (to max(1, |value|)), every RL metric of both steps
WEIGHT_BOUND = 1e-2  # the two runs' weights after two steps apart by at most this share of the update's norm


def _config(out: Path, model: list[str]):
    # conf/pipeline/reproduce.yaml's RL (gating, crops, sub-agents trained, KL), smaller, per row unless
    # `model` turns rl.shared_prefix on: the path before #45 had no shared prefixes (held to the per-row
    # path by tests/integration/test_shared_prefix.py).
    return load_config(REPO / "conf/pipeline/reproduce.yaml", [
        f"run.output_dir={out}", "model.pretrain.enabled=false", "model.pretrain.sft_replay_rows=0",
        "rl.shared_prefix=false", *model,
        "rl.prompts_per_step=2", "rl.group_size=2",
        "rl.micro_batch_size=3", "rl.rollout.max_new_tokens=6", "rl.rollout.subagent_max_new_tokens=5",
        "rl.learning_rate=0.01", "video.crop_max_frames=4", "video.max_pixels=3072"])


def _two_steps(tmp: Path, init, rl_data, model: list[str], monkeypatch) -> tuple[list[dict], str, object]:
    from paravt_core.dist.rank import shutdown_distributed
    from paravt_core.rl import stage
    from paravt_core.rl.worker import Trainer

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    job = stage.make_job(_config(tmp, model), init, rl_data, with_mlflow=False)
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

    from paravt_core.model import fast_paths

    init, rl_data = rl_inputs
    deduped: list[tuple[int, int]] = []  # (distinct frames, frames) of each batch the dedupe looked at

    def counting(pixel_values, grid_thw):
        firsts, of = distinct(pixel_values, grid_thw)
        deduped.append((len(firsts), len(of)))
        return firsts, of

    distinct = fast_paths.distinct_items
    with monkeypatch.context() as patched:
        patched.setattr(fast_paths, "distinct_items", counting)
        fast_rows, fast_weights, fast = _two_steps(tmp_path / "fast", init, rl_data, EXACT, monkeypatch)
    # The policy, the reference and the rollout engine all took the batched vision attention and the dedupe,
    # and the dedupe really left frames out (a group's rollouts share their overview frames).
    assert _is_batched(fast.policy.module) and _is_batched(fast.ref_model) and _is_batched(fast.engine.engine.model)
    assert {fast.policy.module.model._paravt_vision_dedupe, fast.ref_model.model._paravt_vision_dedupe,
            fast.engine.engine.model.model._paravt_vision_dedupe} == {"no_grad"}
    assert any(unique < total for unique, total in deduped)
    assert fast_rows[0]["kappa"] == 2.0 and fast_rows[0]["trajectories"] > 4  # crops and sub-agents ran
    with monkeypatch.context() as patched:
        patched.setattr(hf_engine, "PreallocatedCache", lambda layers, capacity: DynamicCache())
        slow_rows, slow_weights, slow = _two_steps(tmp_path / "slow", init, rl_data, BEFORE, monkeypatch)
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
    cfg = _config(Path("unused"), EXACT)
    prompts = [p.prompt for p in read_rl_prompts(stage.rl_shards(rl_data))]

    def episodes(vision_attention: str, vision_dedupe: str):
        speed = cfg.model.model_copy(update={"vision_attention": vision_attention, "vision_dedupe": vision_dedupe})
        engine, processor = eval_stage.hf_engine(cfg.model_copy(update={"model": speed}), model)
        assert _is_batched(engine.model) == (vision_attention == "batched")
        main = ScriptedFirstTurn(engine, processor.tokenizer)
        return run_episodes(main, processor, prompts, cfg.rl.rollout, cfg.video, temperature=0.0)

    fast = episodes("batched", "no_grad")
    with monkeypatch.context() as patched:
        patched.setattr(hf_engine, "PreallocatedCache", lambda layers, capacity: DynamicCache())
        slow = episodes("per_item", "never")
    assert all(e.tool_calls == 2 for e in fast)
    assert [e.token_ids.tolist() for e in fast] == [e.token_ids.tolist() for e in slow]
    assert [e.old_logprobs.tolist() for e in fast] == [e.old_logprobs.tolist() for e in slow]


def _max_logprob_gap(trajs, ids, variants: dict[str, dict[str, str]], model_dir: Path) -> dict[str, float]:
    """Largest |log-prob difference| on the trained tokens of `trajs`, each variant against the exact path.

    With autograd on, as in the policy's update (`vision_dedupe: always` acts only there)."""
    import torch

    from paravt_core.model.loading import load_model
    from paravt_core.rl import policy as P

    def logprobs(options: dict[str, str]) -> list:
        model = load_model(model_dir, vision_attention="batched", **options).train()
        rows = []
        for i in range(0, len(trajs), 3):
            batch = trajs[i:i + 3]
            logp, _ = P.sequence_logprobs(model, batch, ids["pad"], ids["image"], ids["video"], 1.0, "cpu",
                                          needed=P._needed(batch))
            rows.append(logp.detach() * P._needed(batch))
        return rows

    exact = logprobs({})
    return {name: max(float((a - b).abs().max()) for a, b in zip(logprobs(options), exact))
            for name, options in variants.items()}


def test_rounding_switches_stay_within_their_bounds(rl_inputs, tmp_path, monkeypatch):
    from paravt_core.model import fast_paths
    from paravt_core.rl import policy as P

    init, rl_data = rl_inputs
    exact_rows, _, exact = _two_steps(tmp_path / "exact", init, rl_data, EXACT, monkeypatch)
    # One more rollout of the exact trainer gives trajectories with left padding in every micro-batch.
    _, episodes = exact.rollout(2)
    trajs = P.trajectories(episodes, True)
    assert any(t.is_subagent for t in trajs) and len({t.token_ids.numel() for t in trajs}) > 1
    variants = {name: {name: value} for name, value in ROUNDING.items()} | {"all": ROUNDING}
    used: list[list[int]] = []  # the left padding of each prefill the causal path ran
    padding_of = fast_paths.left_padding_of
    with monkeypatch.context() as patched:
        patched.setattr(fast_paths, "left_padding_of", lambda mask: used.append(padding_of(mask)) or used[-1])
        gaps = _max_logprob_gap(trajs, exact.ids, variants, init.path)
    assert any(p and max(p) > 0 for p in used)  # the causal path ran, on padded rows
    assert all(gap <= LOGPROB_BOUND for gap in gaps.values()), gaps

    rows, _, fast = _two_steps(tmp_path / "rounding", init, rl_data, [*EXACT, *(f"model.{k}={v}" for k, v in
                                                                              ROUNDING.items())], monkeypatch)
    module = fast.policy.module
    assert module.model._paravt_vision_dedupe == "always"
    assert getattr(module.model.visual.patch_embed.proj.forward, "__func__", None) is fast_paths._linear_patch_embed
    attention = module.model.language_model.layers[0].self_attn
    assert getattr(attention.forward, "__func__", None) is fast_paths._causal_rows_text_forward
    assert [sorted(r) for r in rows] == [sorted(r) for r in exact_rows]
    for step, (a, b) in enumerate(zip(rows, exact_rows)):
        for key in a:
            assert abs(a[key] - b[key]) <= METRIC_BOUND * max(1.0, abs(b[key])), (step, key, a[key], b[key])
    # Adam turns a near-zero gradient element into a step of about lr whatever its size, so a
    # rounding-level gradient change can move a single weight by up to ~2 lr: the bound is on
    # the whole update (its norm), where a real fault moves every element.
    from paravt_core.model.loading import load_model

    start = load_model(init.path).state_dict()
    ours, theirs = module.state_dict(), exact.policy.module.state_dict()
    apart = sum(float((ours[k] - theirs[k]).double().square().sum()) for k in theirs) ** 0.5
    update = sum(float((theirs[k] - start[k]).double().square().sum()) for k in theirs) ** 0.5
    print(f"rounding switches: log-prob gaps {gaps}, update apart {apart:.3g} of {update:.3g}")
    assert 0 < apart <= WEIGHT_BOUND * update, (apart, update)  # not bit for bit (else this checks nothing), close
