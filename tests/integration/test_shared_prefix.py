"""`rl.shared_prefix` (paravt_core/rl/shared_prefix.py): each group's prefix once, the per-row path's
log-probs and gradients within a stated tolerance, and planted faults far outside it (issue #64).

The step's trajectories come from `run_episodes` on the tiny kit with a scripted engine (the
random model never calls a tool): three episodes of one prompt whose first turns call crops, so
their sub-agents run; one episode calls a second crop, so one sub-agent has a crop of its own.
Two more episodes run in `frames` tool mode and call different crops, so the crops' frames lie
after their shared prefix (vision in the suffixes). The answers and summaries have uneven
lengths, and two answers (and the sub-agents' summaries) begin alike, so the shared prefix runs
into trained tokens.

TOLERANCE: float32 on CPU, measured on the development machine: log-probs within 1e-6 nats
(1.4e-6 under activation checkpointing, its recompute dense or piecewise), every parameter's
gradient within 2.5e-6 of its largest element (relative), the dense mask, the piecewise
attention and checkpointing alike. The bounds below (1e-5 nats, 3e-5) are about ten times
that, of the order of the rounding switches' (tests/integration/test_speed_determinism.py,
tests/unit/test_fast_paths.py). Each planted fault moves them by orders of magnitude more
(measured: a suffix seeing the previous suffix's keys 6.8e-2 nats and 0.14 of the gradient;
suffix positions shifted by one 5.7e-2 nats and 0.32; the prefix's gradient taken from the
first suffix only, log-probs unchanged, 0.70 of the gradient).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paravt_core.agent.engine import Generation
from paravt_core.agent.prompts import question_prompt
from paravt_core.agent.rollout import run_episodes
from paravt_core.config import load_config
from paravt_core.model.loading import load_model
from paravt_core.rl import policy, shared_prefix
from paravt_core.rl.policy import (
    _needed,
    micro_batch_loss,
    micro_batches,
    reference_pass,
    sequence_logprobs,
    trajectories,
)
from tests.integration.test_speed_determinism import EXACT, _two_steps, rl_inputs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7
LOGPROB_TOLERANCE = 1e-5  # nats, any trained token
GRADIENT_TOLERANCE = 3e-5  # of the largest element of each parameter's per-row gradient
CALL = '<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "v.mp4", "start_time": {}, "end_time": {}}}}}</tool_call>'
ANSWERS = ["the red square</think>\n<answer>A</answer>",
           "the red square moves right, then it stops</think>\n<answer>B</answer>",
           "blue</think>\n<answer>C</answer>"]


class ScriptedEngine:
    """First turns call crops (request 0 of a batch two, the others one), sub-agents and answers
    write texts of uneven lengths; decided per request from its token ids."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, requests, params):
        out = []
        for j, request in enumerate(requests):
            text = self.tok.decode(request.prompt_ids)
            if "concise, factual summary" in text:
                reply = "a square moves" + " right" * (j + 1)
            elif text.count("<|im_start|>assistant") == 1:
                reply = "<think>\nlook</think>\n" + CALL.format(1, 5) + (CALL.format(6, 11) if j == 0 else "")
            else:
                reply = ANSWERS[j % len(ANSWERS)]
            ids = self.tok(reply, add_special_tokens=False)["input_ids"] + [self.end]
            out.append(Generation(ids, [-1.0] * len(ids), "stop"))
        return out


@pytest.fixture()
def step(tiny_model, tiny_processor, short_video):
    """(the step's trajectories, token ids of the model)."""
    cfg = _config()
    engine = ScriptedEngine(tiny_processor.tokenizer)
    prompt = question_prompt("a", short_video, "What colour is the square?")
    episodes = run_episodes(engine, tiny_processor, [prompt], cfg.rl.rollout, cfg.video, group_size=3)
    framed = run_episodes(engine, tiny_processor, [question_prompt("b", short_video, "Where does it go?")],
                          cfg.rl.rollout, cfg.video, group_size=2, tool_mode="frames")
    trajs = trajectories(episodes, train_subagents=True) + trajectories(framed, train_subagents=False)
    ids = {"pad": tiny_processor.tokenizer.pad_token_id, "image": tiny_model.config.image_token_id,
           "video": tiny_model.config.video_token_id}
    return trajs, ids


def _config(*overrides: str):
    return load_config(REPO / "conf/pipeline/tiny.yaml", ["video.nframes=2", "video.max_pixels=3072",
                                                          "rl.rollout.max_turns=1", "video.crop_max_frames=2",
                                                          "rl.kl_mode=loss", *overrides])


def _values_and_grads(model, compute, needed):
    model.zero_grad(set_to_none=True)
    logp = compute()
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(0)) * needed  # [B, L]
    (logp * weights).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _gaps(got, want) -> tuple[float, float]:
    """(largest log-prob difference, largest gradient difference relative to its parameter's largest element)."""
    (logp, grads), (logp_want, grads_want) = got, want
    assert grads.keys() == grads_want.keys()
    relative = max(float((grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for n, g in grads_want.items())
    return float((logp - logp_want).abs().max()), relative


def test_packing_shares_prompts_crops_and_leading_answer_tokens(tiny_model, step):
    trajs, ids = step
    packed = shared_prefix.pack(trajs, ids, tiny_model)
    by_member = {tuple(row.members): row for row in packed.rows}
    main, subagents = [0, 1, 2], [i for i, t in enumerate(trajs) if t.is_subagent]
    assert by_member.keys() >= {tuple(main)}
    assert packed.rows[0].prefix > max(trajs[i].prompt_length for i in main)  # two answers begin alike, and more
    shared_crop = [row for row in packed.rows if len(row.members) > 1 and set(row.members) <= set(subagents)]
    assert len(shared_crop) == 1 and len(shared_crop[0].members) == 3
    assert [i for i in subagents if i not in shared_crop[0].members] == [r.members[0] for r in packed.rows
                                                                          if set(r.members) <= set(subagents)
                                                                          and len(r.members) == 1]
    framed = next(row for row in packed.rows if len(trajs) - 1 in row.members)
    assert len(framed.members) == 2
    media = [shared_prefix.media_of(trajs[i], ids, 2) for i in framed.members]
    assert all(any(m.start >= framed.prefix for m in ms) for ms in media)  # each keeps crops of its own
    # Every member has a suffix; the packed rows hold fewer tokens than the per-row batch.
    assert all(end > start for row in packed.rows for start, end in row.spans)
    assert packed.inputs["input_ids"].numel() < len(trajs) * max(t.token_ids.numel() for t in trajs)


def test_logprobs_and_gradients_equal_the_per_row_path_and_planted_faults_break_them(tiny_model, step):
    trajs, ids = step
    model = tiny_model.train()
    needed = _needed(trajs)

    def per_row():
        return sequence_logprobs(model, trajs, ids["pad"], ids["image"], ids["video"], TEMPERATURE, "cpu",
                                 needed=needed)[0]

    def shared(**options):
        return lambda: shared_prefix.shared_prefix_logprobs(model, trajs, ids, TEMPERATURE, "cpu", needed, **options)

    want = _values_and_grads(model, per_row, needed)
    for options in ({}, {"segmented": False}):
        logp_gap, grad_gap = _gaps(_values_and_grads(model, shared(**options), needed), want)
        assert logp_gap <= LOGPROB_TOLERANCE and grad_gap <= GRADIENT_TOLERANCE, (options, logp_gap, grad_gap)
    for plant in ("leak", "shift", "once"):
        logp_gap, grad_gap = _gaps(_values_and_grads(model, shared(plant=plant), needed), want)
        assert grad_gap > 100 * GRADIENT_TOLERANCE, (plant, logp_gap, grad_gap)
        if plant != "once":  # the forward is right there; only the prefix's gradient is short
            assert logp_gap > 100 * LOGPROB_TOLERANCE, (plant, logp_gap)


def _count_piecewise(monkeypatch) -> dict[str, int]:
    """Counts of the packed rows' piecewise attention calls, in forwards and in the backward's
    recomputes (while autograd runs a graph task)."""
    calls = {"forward": 0, "recompute": 0}
    segmented = shared_prefix._segmented

    def counting(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is shared_prefix._ACTIVE.get("mask"):  # a packed row's piecewise attention
            calls["recompute" if torch._C._current_graph_task_id() != -1 else "forward"] += 1
        return segmented(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setattr(shared_prefix, "_segmented", counting)
    return calls


def test_checkpointing_keeps_the_piecewise_attention_through_the_recompute(tiny_model, step, monkeypatch):
    """Under activation checkpointing (`rl.gradient_checkpointing`) the backward recomputes each
    layer after `segmented_attention` has exited. Checkpointing as the RL worker turns it on
    (`enable_checkpointing`) re-arms the piecewise attention for every layer's recompute; any other
    checkpointing runs the dense mask in both. Both give the per-row results; a piecewise forward
    whose recompute is not re-armed is refused by torch, never silently mixed."""
    trajs, ids = step
    model = tiny_model.train()
    needed = _needed(trajs)
    want = _values_and_grads(model, lambda: sequence_logprobs(model, trajs, ids["pad"], ids["image"], ids["video"],
                                                              TEMPERATURE, "cpu", needed=needed)[0], needed)
    calls = _count_piecewise(monkeypatch)

    def shared():
        return shared_prefix.shared_prefix_logprobs(model, trajs, ids, TEMPERATURE, "cpu", needed)

    layers = model.config.get_text_config().num_hidden_layers
    shared_prefix.enable_checkpointing(model)
    assert shared_prefix._checkpointing(model) == "rearmed"
    logp_gap, grad_gap = _gaps(_values_and_grads(model, shared, needed), want)
    assert logp_gap <= LOGPROB_TOLERANCE and grad_gap <= GRADIENT_TOLERANCE, ("rearmed", logp_gap, grad_gap)
    assert calls == {"forward": layers, "recompute": layers}, calls  # every layer piecewise, twice
    assert not shared_prefix._ACTIVE and model.config.get_text_config()._attn_implementation == "sdpa"

    model.activation_checkpointing_disable()
    model.activation_checkpointing_enable()  # transformers' own: no context_fn
    assert shared_prefix._checkpointing(model) == "other"
    calls.update(forward=0, recompute=0)
    logp_gap, grad_gap = _gaps(_values_and_grads(model, shared, needed), want)
    assert logp_gap <= LOGPROB_TOLERANCE and grad_gap <= GRADIENT_TOLERANCE, ("dense", logp_gap, grad_gap)
    assert calls == {"forward": 0, "recompute": 0}, calls

    # Planted: the forward piecewise, its recompute left to the model's own attention (dense).
    monkeypatch.setattr(shared_prefix, "_checkpointing", lambda model: "rearmed")
    with pytest.raises(torch.utils.checkpoint.CheckpointError):
        _values_and_grads(model, shared, needed)


def test_micro_batches_by_group_keep_the_count_and_put_members_together(step):
    trajs, _ = step
    shuffled = [trajs[i] for i in (3, 0, 7, 4, 1, 8, 5, 2, 6)]
    plain = micro_batches(shuffled, 3, count=4)
    grouped = micro_batches(shuffled, 3, count=4, by_group=True)
    assert len(grouped) == len(plain) == 4 and grouped[-1].filler
    order = [t for batch in grouped[:-1] for t in batch.trajs]
    assert sorted(map(id, order)) == sorted(map(id, shuffled))
    keys = [shared_prefix.group_key(t) for t in order]
    assert all(keys.index(k) == i or keys[i - 1] == k for i, k in enumerate(keys))  # each group contiguous


def test_the_step_passes_give_the_per_row_results_with_the_switch(tiny_model, step):
    """`reference_pass` (micro-batches by group: results go back to their own trajectories) and
    `micro_batch_loss` (the step's token mean: same loss, same gradients) under `rl.shared_prefix`."""
    trajs, ids = step
    model = tiny_model.train()
    generator = torch.Generator().manual_seed(1)
    for t in trajs:
        t.advantages = torch.randn(t.token_ids.numel(), generator=generator) * t.loss_mask
        t.old_logprobs = -torch.rand(t.token_ids.numel(), generator=generator)
    shuffled = [trajs[i] for i in (3, 0, 7, 4, 1, 8, 5, 2, 6)]  # groups split, so the reorder matters
    total = float(sum(t.loss_mask.sum() for t in trajs))
    results = {}
    for shared in (False, True):
        rl = _config(f"rl.shared_prefix={str(shared).lower()}").rl
        with torch.no_grad():
            reference_pass(model, shuffled, 3, ids, TEMPERATURE, "cpu", shared_prefix=shared)
        refs = [t.ref_logprobs.clone() for t in shuffled]
        model.zero_grad(set_to_none=True)
        loss = sum(micro_batch_loss(model, batch.trajs, rl, ids, total, "cpu")[0]
                   for batch in micro_batches(shuffled, 3, by_group=shared))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[shared] = refs, float(loss.detach()), grads
    (refs, loss, grads), (refs_shared, loss_shared, grads_shared) = results[False], results[True]
    assert max(float((a - b).abs().max()) for a, b in zip(refs, refs_shared)) <= LOGPROB_TOLERANCE
    assert abs(loss - loss_shared) <= 1e-5 * max(1.0, abs(loss))
    assert _gaps((torch.zeros(1), grads_shared), (torch.zeros(1), grads))[1] <= GRADIENT_TOLERANCE


def test_the_second_pass_reuses_the_first_passes_packing_and_nothing_else(tiny_model, step, monkeypatch):
    """`shared_prefix.PACKED`: the policy pass packs none of the micro-batches the reference pass packed
    (the same trajectory objects, in order), with bit-equal results; equal trajectories that are other
    objects, or another planted fault, pack again."""
    import copy

    trajs, ids = step
    shared_prefix.PACKED.clear()
    packed: list[int] = []
    real = shared_prefix._pack
    monkeypatch.setattr(shared_prefix, "_pack", lambda trajs, *rest: packed.append(len(trajs)) or real(trajs, *rest))
    needed = _needed(trajs)
    with torch.no_grad():
        first = shared_prefix.shared_prefix_logprobs(tiny_model, trajs, ids, TEMPERATURE, "cpu", needed)
        again = shared_prefix.shared_prefix_logprobs(tiny_model, trajs, ids, TEMPERATURE, "cpu", needed)
        assert packed == [len(trajs)] and torch.equal(first, again)
        copies = copy.deepcopy(trajs)  # equal tokens and media, other objects: not this memo's to answer
        assert torch.equal(shared_prefix.shared_prefix_logprobs(tiny_model, copies, ids, TEMPERATURE, "cpu", needed),
                           first)
        assert packed == [len(trajs)] * 2
        shared_prefix.shared_prefix_logprobs(tiny_model, trajs, ids, TEMPERATURE, "cpu", needed, plant="shift")
        assert packed == [len(trajs)] * 3
        shared_prefix.PACKED.clear()
        assert torch.equal(shared_prefix.shared_prefix_logprobs(tiny_model, trajs, ids, TEMPERATURE, "cpu", needed),
                           first)
        assert packed == [len(trajs)] * 4
    # Bounded by bytes, oldest out first; an entry over the bound is not kept at all.
    packing = shared_prefix.pack(trajs, ids, tiny_model)
    size = shared_prefix.PackMemo.nbytes(packing)
    memo = shared_prefix.PackMemo(max_bytes=2 * size)
    for k in range(3):
        memo.put((k,), trajs, packing)
    assert memo.get((0,), trajs) is None and memo.get((2,), trajs) is packing and memo.get((2,), trajs[1:]) is None
    assert memo.get((1,), trajs) is packing and memo._bytes == 2 * size
    small = shared_prefix.PackMemo(max_bytes=size - 1)
    small.put((0,), trajs, packing)
    assert small.get((0,), trajs) is None and small._bytes == 0


@pytest.mark.gpu
def test_on_the_card_checkpointing_recomputes_piecewise_in_the_backward_thread(tiny_model_dir, step, monkeypatch):
    """On CUDA the backward (and so each layer's recompute) runs in the autograd engine's device
    thread, not the caller's: the re-armed recompute still attends piecewise on every layer, and
    the results stay the per-row path's. float32; the bounds (1e-4 nats, 1e-3 of each parameter's
    largest gradient element) are set between the CPU's rounding and the planted faults' gaps
    (5.7e-2 nats, 0.14), not measured on a card yet."""
    trajs, ids = step
    model = load_model(tiny_model_dir, device="cuda").train()
    needed = _needed(trajs)

    def values_and_grads(compute):
        model.zero_grad(set_to_none=True)
        logp = compute()
        weights = (torch.randn(logp.shape, generator=torch.Generator().manual_seed(0)) * needed).to(logp.device)
        (logp * weights).sum().backward()
        return logp.detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}

    calls = _count_piecewise(monkeypatch)
    shared_prefix.enable_checkpointing(model)
    want = values_and_grads(lambda: sequence_logprobs(model, trajs, ids["pad"], ids["image"], ids["video"],
                                                      TEMPERATURE, "cuda", needed=needed)[0])
    got = values_and_grads(lambda: shared_prefix.shared_prefix_logprobs(model, trajs, ids, TEMPERATURE, "cuda",
                                                                        needed))
    layers = model.config.get_text_config().num_hidden_layers
    assert calls == {"forward": layers, "recompute": layers}, calls
    logp_gap, grad_gap = _gaps(got, want)
    assert logp_gap <= 1e-4 and grad_gap <= 1e-3, (logp_gap, grad_gap)


def test_eager_attention_gets_an_additive_mask(tiny_model_dir, step):
    """Under `model.attn_implementation: eager` the dense mask is additive; both paths still agree."""
    trajs, ids = step
    model = load_model(tiny_model_dir, attn_implementation="eager").eval()
    needed = _needed(trajs)
    with torch.no_grad():
        want = sequence_logprobs(model, trajs, ids["pad"], ids["image"], ids["video"], TEMPERATURE, "cpu",
                                 needed=needed)[0]
        for segmented in (True, False):
            got = shared_prefix.shared_prefix_logprobs(model, trajs, ids, TEMPERATURE, "cpu", needed,
                                                       segmented=segmented)
            assert float((got - want).abs().max()) <= LOGPROB_TOLERANCE, segmented


def test_the_trainer_runs_both_passes_shared_when_the_switch_is_on(rl_inputs, tmp_path, monkeypatch):  # noqa: F811
    """`rl/worker.py` hands `rl.shared_prefix` to the reference pass (no autograd) and the policy's
    micro-batches (autograd): both go through the shared-prefix path, and the steps train."""
    init, rl_data = rl_inputs
    calls: list[bool] = []  # autograd on, at each call
    real = policy.shared_prefix_logprobs
    monkeypatch.setattr(policy, "shared_prefix_logprobs",
                        lambda *args, **kwargs: calls.append(torch.is_grad_enabled()) or real(*args, **kwargs))
    hits = shared_prefix.PACKED.hits
    rows, _, _ = _two_steps(tmp_path, init, rl_data, [*EXACT, "rl.shared_prefix=true"], monkeypatch)
    assert False in calls and True in calls
    # The policy pass reused the reference pass's packing, and no step's packing outlived its step.
    assert shared_prefix.PACKED.hits > hits and not shared_prefix.PACKED._entries
    assert all(torch.isfinite(torch.tensor(value)) for row in rows for value in row.values())


def test_the_rollout_engine_shares_a_groups_start_at_its_later_turn(tiny_model, tiny_processor, short_video):
    """Issue #64 item 3 on the rollout's own prompts (a video's frames as the pipeline renders them, a
    real tool round, not the unit test's hand-made requests): at the main
    agent's second turn a group's requests share system turn, video and question, then differ by their
    first turns and tool responses; the `hf` engine with `share_prompts` continues them as the plain
    path does (greedy tokens equal, log-probs within 1e-5)."""
    from paravt_core.agent.engine import SamplingParams
    from paravt_core.agent.hf_engine import HFEngine, shared_prefixes

    compared = []

    class Comparing(ScriptedEngine):
        def generate(self, requests, params):
            text = self.tok.decode(requests[0].prompt_ids)
            if "concise, factual summary" not in text and text.count("<|im_start|>assistant") > 1:
                greedy = SamplingParams(max_new_tokens=6, stop_token_ids=(-1,))
                compared.append((requests, HFEngine(tiny_model, tiny_processor).generate(requests, greedy),
                                 HFEngine(tiny_model, tiny_processor, share_prompts=True).generate(requests, greedy)))
            return super().generate(requests, params)

    cfg = _config()
    prompt = question_prompt("a", short_video, "What colour is the square?")
    run_episodes(Comparing(tiny_processor.tokenizer), tiny_processor, [prompt], cfg.rl.rollout, cfg.video, group_size=3)
    (requests, plain, shared), = compared
    media = (tiny_model.config.image_token_id, tiny_model.config.video_token_id)
    firsts, _, common = shared_prefixes(requests, media)
    assert all(r.vision.image_grid_thw is not None for r in requests)  # the overview's frames
    assert len(firsts) == 1 and len({len(r.prompt_ids) for r in requests}) > 1  # one start, rests of their own
    assert common[0] > max(i for i, t in enumerate(requests[0].prompt_ids) if t in media)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
