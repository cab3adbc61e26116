"""The agentic rollout (SPEC §3) and the rollout engines on the tiny Qwen3-VL.

Protocol tests drive `run_episodes` with `ScriptedEngine`, a test double that answers each
request with fixed text chosen from its decoded prompt (main-agent turn k gets script k, a
sub-agent gets a summary naming its window), so the expected ids, masks and responses are
known exactly. Engine tests run the real `HFEngine` on the tiny model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from paravt_core.agent import rollout as rollout_module
from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams
from paravt_core.agent.hf_engine import HFEngine
from paravt_core.agent.prompts import frames_tool_text, question_prompt
from paravt_core.agent.rollout import Episode, run_episodes
from paravt_core.config import RolloutConfig, VideoConfig
from paravt_core.agent.media import clip_images, clip_items, with_frames
from paravt_core.video import sample_overview_frames, sample_window_frames

pytestmark = pytest.mark.integration

VIDEO_CFG = VideoConfig(nframes=4, max_pixels=6144)
# The image processor's bounds the trainer renders with (SPEC §3); the tiny kit's own are Qwen3-VL's.
TRAINER_SIZE = {"shortest_edge": VIDEO_CFG.min_pixels, "longest_edge": VIDEO_CFG.max_pixels}
SUBAGENT_MARK = "concise, factual summary"
_WINDOW_RE = re.compile(r"window (\d\d:\d\d) to (\d\d:\d\d)")
ANSWER = "The evidence points to red.\n</think>\n<answer>A</answer>"


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny model gains nothing from a second thread, and on a shared 2-core machine a
    contended second thread made single `generate` calls 20-80x slower (0.06 s vs 1-5 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def summary_for(prompt: str) -> str:
    start, end = _WINDOW_RE.search(prompt).groups()
    return f"From {start} to {end} a red square moves to the right."


class ScriptedEngine:
    """RolloutEngine test double: scripted completions, a fixed logprob per position, call log."""

    def __init__(self, processor, main_turns: Sequence[str], summary: Callable[[str], str] = summary_for):
        self.tokenizer = processor.tokenizer
        self.turn_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.main_turns = list(main_turns)
        self.summary = summary
        self.calls: list[tuple[list[GenerationRequest], SamplingParams]] = []

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        self.calls.append((list(requests), params))
        return [self._answer(request, params) for request in requests]

    def _answer(self, request: GenerationRequest, params: SamplingParams) -> Generation:
        prompt = self.tokenizer.decode(request.prompt_ids)
        if SUBAGENT_MARK in prompt:
            text = self.summary(prompt)
        else:
            turn = prompt.count("<|im_start|>assistant") - 1
            text = self.main_turns[min(turn, len(self.main_turns) - 1)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.turn_end]
        ids = ids[: params.max_new_tokens]
        logprobs = [-(position + 1) / 100 for position in range(len(ids))]
        return Generation(ids, logprobs, "stop" if ids[-1] == self.turn_end else "length")

    def update_weights(self, state_dict) -> None:
        raise NotImplementedError("a scripted engine has no weights")

    def calls_of(self, kind: str) -> list[list[GenerationRequest]]:
        """The request lists of the main-agent ("main") or sub-agent ("sub") engine calls."""
        def is_sub(requests):
            return SUBAGENT_MARK in self.tokenizer.decode(requests[0].prompt_ids)
        return [requests for requests, _ in self.calls if is_sub(requests) == (kind == "sub")]


def crop_json(start: float, end: float, path: str = "clip.mp4") -> str:
    return (f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "{path}", '
            f'"start_time": {start}, "end_time": {end}}}}}</tool_call>')


def crop_python(start: float, end: float) -> str:
    return f'<tool_code>crop_video(video_path="clip.mp4", start_time={start}, end_time={end})</tool_code>'


def calls_turn(windows: Sequence[tuple[float, float]], python_style: bool = False) -> str:
    make = crop_python if python_style else crop_json
    return "I need a closer look.\n</think>\n" + "\n".join(make(s, e) for s, e in windows)


def rollout_cfg(**overrides) -> RolloutConfig:
    return RolloutConfig(**{"max_new_tokens": 400, "subagent_max_new_tokens": 64, **overrides})


def one_prompt(video: Path, nframes: int | None = None):
    return question_prompt("p0", video, "What colour is the square?", nframes=nframes)


# --- token deltas equal a full render ------------------------------------------------------


def _tool_messages(processor, video: Path, windows, tool_mode: str):
    """The tool messages of one round, built independently of the rollout, and their crop frames."""
    messages, crops = [], []
    for start, end in windows:
        if tool_mode == "frames":
            frames = sample_window_frames(video, start, end, min_pixels=VIDEO_CFG.min_pixels,
                                          max_pixels=VIDEO_CFG.max_pixels)
            crops.append(frames)
            text = frames_tool_text(len(frames.indices), start, end)
            messages.append({"role": "tool", "content": [*clip_items(frames), {"type": "text", "text": text}]})
        else:
            clock = lambda t: f"{int(t) // 60:02d}:{int(t) % 60:02d}"  # noqa: E731
            messages.append({"role": "tool", "content": f"From {clock(start)} to {clock(end)} a red square "
                                                         "moves to the right."})
    return messages, crops


def _full_ids(processor, prompt, overview, messages, crops, add_generation_prompt: bool) -> tuple[list[int], dict]:
    text = processor.apply_chat_template(messages, tools=list(prompt.tools), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    if add_generation_prompt:
        text += "<think>\n"
    batch = processor(text=[text], images=clip_images([overview, *crops]), return_tensors="pt", size=TRAINER_SIZE)
    return batch["input_ids"][0].tolist(), batch


@pytest.mark.parametrize("tool_mode", ["subagent", "frames"])
@pytest.mark.parametrize("n_calls", [1, 2, 5])
def test_delta_built_ids_equal_a_full_render(tiny_processor, short_video, n_calls, tool_mode):
    first = [(2 * i, 2 * i + 2) for i in range(n_calls)]
    second = [(1, 3)]
    scripts = [calls_turn(first), calls_turn(second, python_style=True), ANSWER]
    engine = ScriptedEngine(tiny_processor, scripts)
    prompt = one_prompt(short_video)
    (episode,) = run_episodes(engine, tiny_processor, [prompt], rollout_cfg(), VIDEO_CFG, tool_mode=tool_mode)

    overview = sample_overview_frames(short_video, 4, min_pixels=VIDEO_CFG.min_pixels, max_pixels=VIDEO_CFG.max_pixels)
    messages, crops = with_frames(prompt.messages, [overview]), []
    main_requests = [requests[0] for requests in engine.calls_of("main")]
    assert len(main_requests) == 3
    for turn, (script, windows) in enumerate(zip(scripts, [first, second, None])):
        expected_prompt, _ = _full_ids(tiny_processor, prompt, overview, messages, crops, add_generation_prompt=True)
        assert main_requests[turn].prompt_ids == expected_prompt, f"generation prompt of turn {turn}"
        messages.append({"role": "assistant", "content": "<think>\n" + script})
        if windows is not None:
            tool_messages, turn_crops = _tool_messages(tiny_processor, short_video, windows, tool_mode)
            messages += tool_messages
            crops += turn_crops

    full, batch = _full_ids(tiny_processor, prompt, overview, messages, crops, add_generation_prompt=False)
    newline = tiny_processor.tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert full[-len(newline):] == newline  # the template's text after the final <|im_end|>
    assert episode.token_ids.tolist() == full[: -len(newline)]
    torch.testing.assert_close(episode.vision.pixel_values, batch["pixel_values"])
    assert torch.equal(episode.vision.image_grid_thw, batch["image_grid_thw"])
    assert episode.vision.pixel_values_videos is None
    assert episode.tool_calls == n_calls + 1 and episode.turns == 3 and episode.end_reason == "answer"


# --- protocol ---------------------------------------------------------------------------------


def tool_turn_text(episode: Episode, round_index: int = 0) -> str:
    forced = [segment.text for segment in episode.transcript if not segment.generated]
    tool_segments = [text for text in forced if "<tool_response>" in text]
    return tool_segments[round_index]


def responses_of(turn_text: str) -> list[str]:
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn_text, re.DOTALL)


def test_malformed_block_gets_an_error_and_valid_siblings_run(tiny_processor, short_video):
    malformed = '<tool_call>{"name": "crop_video", "arguments": {"start_time": 1,</tool_call>'
    script = "Look.\n</think>\n" + crop_json(0, 4) + malformed + crop_json(6, 9)
    engine = ScriptedEngine(tiny_processor, [script, ANSWER])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(), VIDEO_CFG)
    responses = responses_of(tool_turn_text(episode))
    assert len(responses) == 3
    assert responses[0] == "From 00:00 to 00:04 a red square moves to the right."
    assert responses[1].startswith("Error: malformed JSON")
    assert responses[2] == "From 00:06 to 00:09 a red square moves to the right."
    assert (episode.tool_calls, episode.parse_failures, episode.rejected_calls) == (2, 1, 0)
    assert [len(requests) for requests in engine.calls_of("sub")] == [2]


def test_max_parallel_answers_extra_calls_with_an_error(tiny_processor, short_video):
    script = calls_turn([(0, 1), (1, 2), (2, 3), (3, 4)])
    engine = ScriptedEngine(tiny_processor, [script, ANSWER])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(max_parallel=2), VIDEO_CFG)
    responses = responses_of(tool_turn_text(episode))
    assert [r.startswith("From") for r in responses] == [True, True, False, False]
    assert all("at most 2 crop_video calls" in r for r in responses[2:])
    assert (episode.tool_calls, episode.rejected_calls) == (2, 2)
    assert [len(requests) for requests in engine.calls_of("sub")] == [2]


def test_invalid_window_gets_an_error_and_the_episode_goes_on(tiny_processor, short_video):
    engine = ScriptedEngine(tiny_processor, [calls_turn([(30, 40), (2, 99)]), ANSWER])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(), VIDEO_CFG)
    responses = responses_of(tool_turn_text(episode))
    assert responses[0].startswith("Error: start_time (30 s) is not before the end of the video (12 s)")
    assert responses[1] == "From 00:02 to 00:12 a red square moves to the right."  # end clamped
    assert (episode.tool_calls, episode.rejected_calls, episode.end_reason) == (1, 1, "answer")


@pytest.mark.parametrize("max_turns", [0, 1])
def test_calls_in_the_final_generation_are_unanswered(tiny_processor, short_video, max_turns):
    engine = ScriptedEngine(tiny_processor, [calls_turn([(0, 2), (2, 4)]), calls_turn([(4, 6), (6, 8), (8, 10)])])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(max_turns=max_turns),
                              VIDEO_CFG)
    assert episode.turns == max_turns + 1
    assert episode.end_reason == "max_turns"
    assert episode.tool_calls == 2 * max_turns
    assert episode.unanswered_calls == (2 if max_turns == 0 else 3)
    assert episode.text("transcript").count("<tool_response>") == 2 * max_turns
    assert len(engine.calls_of("sub")) == max_turns


def test_generation_cut_by_length_ends_the_episode_unexecuted(tiny_processor, short_video):
    script = calls_turn([(0, 2)]) + " and more words that run past the token budget " * 20
    engine = ScriptedEngine(tiny_processor, [script])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(max_new_tokens=60),
                              VIDEO_CFG)
    assert episode.end_reason == "length"
    assert (episode.tool_calls, episode.unanswered_calls) == (0, 1)
    assert engine.calls_of("sub") == []


def test_tool_response_is_truncated_to_max_tokens(tiny_processor, short_video):
    long_summary = "a red square moves to the right and then " * 30
    engine = ScriptedEngine(tiny_processor, [calls_turn([(0, 4)]), ANSWER], summary=lambda _: long_summary)
    cfg = rollout_cfg(tool_response_max_tokens=12, subagent_max_new_tokens=256)
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], cfg, VIDEO_CFG)
    (response,) = responses_of(tool_turn_text(episode))
    assert response.endswith(" [truncated]")
    kept = response[: -len(" [truncated]")]
    assert long_summary.startswith(kept)
    assert len(tiny_processor.tokenizer(kept, add_special_tokens=False)["input_ids"]) == 12
    assert episode.subagents[0].response == response


def test_tool_response_text_cannot_smuggle_control_tokens(tiny_processor):
    from paravt_core.agent.context import ChatRenderer

    renderer = ChatRenderer(tiny_processor, think_prefix=True)
    assert renderer.tool_response_text("a<|video_pad|>b<|im_start|>c<|im_end|>", 50) == "abc"


def test_one_frame_crop_is_one_timestamped_image(tiny_processor, short_video):
    engine = ScriptedEngine(tiny_processor, [calls_turn([(3, 4)]), ANSWER])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(), VIDEO_CFG)
    (trajectory,) = episode.subagents
    assert trajectory.vision.image_grid_thw.tolist() == [[1, 4, 6]]  # one image
    assert "<3.0 seconds><|vision_start|>" in tiny_processor.tokenizer.decode(trajectory.prompt_ids)


def test_loss_mask_covers_exactly_the_generated_tokens(tiny_processor, short_video):
    scripts = [calls_turn([(0, 3), (3, 6)]), ANSWER]
    engine = ScriptedEngine(tiny_processor, scripts)
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(), VIDEO_CFG)
    tokenizer = tiny_processor.tokenizer
    generated = [tokenizer(s, add_special_tokens=False)["input_ids"] + [engine.turn_end] for s in scripts]
    mask = episode.loss_mask.bool()
    assert episode.token_ids[mask].tolist() == generated[0] + generated[1]
    for tag in ("<tool_response>", "</tool_response>", "<|image_pad|>", "<think>"):
        tag_id = tokenizer.convert_tokens_to_ids(tag)
        positions = episode.token_ids == tag_id
        assert positions.any() and not mask[positions].any(), tag
    expected_logprobs = [-(i + 1) / 100 for ids in generated for i in range(len(ids))]
    torch.testing.assert_close(episode.old_logprobs[mask], torch.tensor(expected_logprobs))
    assert not episode.old_logprobs[~mask].any()
    assert episode.token_ids.shape == episode.loss_mask.shape == episode.old_logprobs.shape
    assert episode.prompt_length < int(mask.nonzero()[0])
    assert [s.generated for s in episode.transcript] == [False, True, False, True]
    assert episode.text("generated") == "".join(tokenizer.decode(ids) for ids in generated)
    assert episode.text("transcript").startswith("<think>\n")


def test_group_shares_one_overview_decode_and_one_set_of_pixels(tiny_processor, short_video, monkeypatch):
    decodes = []
    real = rollout_module.sample_overview_frames

    def counting(*args, **kwargs):
        decodes.append(kwargs.get("nframes", args[1] if len(args) > 1 else None))
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout_module, "sample_overview_frames", counting)
    engine = ScriptedEngine(tiny_processor, [ANSWER])
    prompts = [one_prompt(short_video, nframes=2), question_prompt("p1", short_video, "When?", nframes=8)]
    episodes = run_episodes(engine, tiny_processor, prompts, rollout_cfg(), VIDEO_CFG, group_size=3)
    assert decodes == [2, 8]  # one decode per prompt, at the prompt's own nframes
    assert [(e.prompt_id, e.sample_index) for e in episodes] == [(p, s) for p in ("p0", "p1") for s in range(3)]
    for group in (episodes[:3], episodes[3:]):
        pixels = {id(e.vision.pixel_values) for e in group}
        assert len(pixels) == 1
    # K overview frames are K images (SPEC §1), never pairs fused into one video group
    assert len(episodes[0].vision.image_grid_thw) == 2 and len(episodes[3].vision.image_grid_thw) == 8
    assert [e.nframes for e in episodes] == [2, 2, 2, 8, 8, 8]


@pytest.mark.parametrize("batched", [True, False])
def test_subagents_of_a_turn_go_to_the_engine_in_one_call(tiny_processor, short_video, batched):
    engine = ScriptedEngine(tiny_processor, [calls_turn([(0, 2), (2, 5), (5, 9)]), ANSWER])
    prompts = [one_prompt(short_video), question_prompt("p1", short_video, "When?")]
    episodes = run_episodes(engine, tiny_processor, prompts, rollout_cfg(), VIDEO_CFG, group_size=2,
                            batched_subagents=batched)
    sizes = [len(requests) for requests, _ in engine.calls]
    assert sizes == ([4, 12, 4] if batched else [4] + [1] * 12 + [4])
    assert all(e.tool_calls == 3 and len(e.subagents) == 3 for e in episodes)
    sub_params = engine.calls[1][1]
    assert sub_params.max_new_tokens == 64


def test_subagent_sees_only_its_window_of_the_episodes_own_video(tiny_processor, short_video):
    script = "Look.\n</think>\n" + crop_json(4, 7, path="/nonexistent/other.mp4; rm -rf /")
    engine = ScriptedEngine(tiny_processor, [script, ANSWER])
    (episode,) = run_episodes(engine, tiny_processor, [one_prompt(short_video)], rollout_cfg(), VIDEO_CFG)
    (trajectory,) = episode.subagents
    window = sample_window_frames(short_video, 4, 7, min_pixels=VIDEO_CFG.min_pixels, max_pixels=VIDEO_CFG.max_pixels)
    clip_text = "".join(f"<{t:.1f} seconds><|vision_start|><|image_pad|><|vision_end|>" for t in window.timestamps)
    expected = tiny_processor(text=[clip_text], images=list(window.array), return_tensors="pt", size=TRAINER_SIZE)
    torch.testing.assert_close(trajectory.vision.pixel_values, expected["pixel_values"])
    window_ids = expected["input_ids"][0].tolist()  # "<t seconds><|vision_start|>pads<|vision_end|>" per frame
    prompt_ids = trajectory.prompt_ids.tolist()
    starts = [i for i in range(len(prompt_ids)) if prompt_ids[i : i + len(window_ids)] == window_ids]
    assert len(starts) == 1
    image_pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert prompt_ids.count(image_pad) == window_ids.count(image_pad)  # no overview frames
    assert "window 00:04 to 00:07 (3.0 seconds)" in tiny_processor.tokenizer.decode(prompt_ids)
    assert trajectory.window == (4.0, 7.0) and trajectory.turn == 0 and trajectory.call_index == 0
    assert trajectory.loss_mask.sum() == trajectory.generated_ids.numel()
    assert trajectory.token_ids.numel() == trajectory.prompt_ids.numel() + trajectory.generated_ids.numel()


# --- the hf engine on the tiny model ---------------------------------------------------------------


def _request(processor, question: str, frames=None) -> GenerationRequest:
    content = ([{"type": "video"}] if frames is not None else []) + [{"type": "text", "text": question}]
    messages = with_frames([{"role": "user", "content": content}], [frames] if frames is not None else [])
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if frames is None:
        return GenerationRequest(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    from paravt_core.agent.context import ChatRenderer

    encoded = ChatRenderer(processor, think_prefix=False, pixel_bounds=(784, 6144)).encode(text, [frames],
                                                                                       continuation=False)
    return GenerationRequest(encoded.token_ids, encoded.vision)


@pytest.fixture()
def mixed_requests(tiny_processor, short_video) -> list[GenerationRequest]:
    """Three requests of different lengths: overview video, text only, a 5-frame window."""
    overview = sample_overview_frames(short_video, 4, max_pixels=6144)
    window = sample_window_frames(short_video, 2, 7, max_pixels=6144)
    return [
        _request(tiny_processor, "What colour is the square?", overview),
        _request(tiny_processor, "What happens first in the video and then what happens after it?"),
        _request(tiny_processor, "Summarize.", window),
    ]


def teacher_forced_logprobs(model, request: GenerationRequest, generated: Sequence[int],
                            temperature: float) -> torch.Tensor:
    """log p(generated token) at each position of one forward pass over prompt + generation: [G]."""
    ids = torch.tensor([list(request.prompt_ids) + list(generated)])
    token_types = torch.zeros_like(ids)
    token_types[ids == model.config.image_token_id] = 1
    token_types[ids == model.config.video_token_id] = 2
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=token_types,
                       **request.vision.as_kwargs()).logits[0]  # [L, V]
    start = len(request.prompt_ids)
    step_logits = logits[start - 1 : start - 1 + len(generated)].float() / (temperature or 1.0)
    return torch.log_softmax(step_logits, -1).gather(1, torch.tensor(generated)[:, None])[:, 0]


def test_hf_batched_greedy_equals_unbatched(tiny_model, tiny_processor, mixed_requests):
    engine = HFEngine(tiny_model, tiny_processor)
    params = SamplingParams(max_new_tokens=24)
    batched = engine.generate(mixed_requests, params)
    for request, together in zip(mixed_requests, batched):
        (alone,) = engine.generate([request], params)
        assert together.token_ids == alone.token_ids
        assert together.finish_reason == alone.finish_reason
        torch.testing.assert_close(torch.tensor(together.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0)
    assert len({len(request.prompt_ids) for request in mixed_requests}) == 3


def test_hf_token_budget_splits_the_batch_with_the_same_greedy_outputs(tiny_model, tiny_processor, mixed_requests,
                                                                       monkeypatch):
    """eval.hf_batch_tokens (issue #44 item 6): sub-batches of at most the budget's left-padded
    prompt tokens, in request order, and the tokens and finish reasons of one batch."""
    requests = mixed_requests + mixed_requests[::-1]  # lengths long, short, mid, mid, short, long
    lengths = [len(request.prompt_ids) for request in requests]
    params = SamplingParams(max_new_tokens=24)
    whole = HFEngine(tiny_model, tiny_processor).generate(requests, params)
    budget = 2 * max(lengths)
    shapes = []
    generate = tiny_model.generate

    def recording(**kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return generate(**kwargs)

    monkeypatch.setattr(tiny_model, "generate", recording)
    split = HFEngine(tiny_model, tiny_processor, max_batch_tokens=budget).generate(requests, params)
    assert 1 < len(shapes) < len(requests) and sum(rows for rows, _ in shapes) == len(requests)
    assert all(rows * length <= budget for rows, length in shapes)
    assert [g.token_ids for g in split] == [g.token_ids for g in whole]
    assert [g.finish_reason for g in split] == [g.finish_reason for g in whole]
    # Log-probs agree to ~5e-7, not bit for bit: a decoding step's matmuls have one row per sequence,
    # and the CPU BLAS picks its kernel (and so its float32 summation order) by the row count
    # (measured: a Linear on [1, 1, d] vs. [2, 1, d] differs by 1-5e-7; batched vs. alone above too).
    torch.testing.assert_close(torch.tensor([lp for g in split for lp in g.logprobs]),
                               torch.tensor([lp for g in whole for lp in g.logprobs]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_hf_logprobs_match_a_teacher_forced_pass(tiny_model, tiny_processor, mixed_requests, temperature):
    engine = HFEngine(tiny_model, tiny_processor)
    generations = engine.generate(mixed_requests, SamplingParams(max_new_tokens=16, temperature=temperature, seed=5))
    for request, generation in zip(mixed_requests, generations):
        expected = teacher_forced_logprobs(tiny_model, request, generation.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


def test_hf_sampling_is_reproducible_with_a_seed(tiny_model, tiny_processor, mixed_requests):
    engine = HFEngine(tiny_model, tiny_processor)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    first, again = engine.generate(mixed_requests, params), engine.generate(mixed_requests, params)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    other = engine.generate(mixed_requests, SamplingParams(max_new_tokens=12, temperature=1.0, seed=12))
    assert [g.token_ids for g in other] != [g.token_ids for g in first]


def test_hf_cuts_each_row_after_its_first_stop_token(tiny_model, tiny_processor, mixed_requests):
    engine = HFEngine(tiny_model, tiny_processor)
    free = engine.generate(mixed_requests, SamplingParams(max_new_tokens=12))
    stop = free[0].token_ids[3]
    cut = engine.generate(mixed_requests, SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)))
    for uncut, row in zip(free, cut):
        if stop in uncut.token_ids:
            assert row.token_ids == uncut.token_ids[: uncut.token_ids.index(stop) + 1]
            assert row.finish_reason == "stop"
        else:
            assert row.token_ids == uncut.token_ids and row.finish_reason == "length"
        assert row.logprobs == pytest.approx(uncut.logprobs[: len(row.token_ids)], abs=1e-5)


def test_hf_update_weights_loads_into_the_engine_model(tiny_model, tiny_processor, mixed_requests):
    engine = HFEngine(tiny_model, tiny_processor)
    params = SamplingParams(max_new_tokens=8)
    before = engine.generate(mixed_requests[1:2], params)[0]
    state = {name: value.clone() for name, value in tiny_model.state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])
    # a gather of named_buffers() also carries the non-persistent rotary buffers
    state.update({name: value.clone() for name, value in tiny_model.named_buffers()})
    engine.update_weights(state)
    assert torch.equal(engine.model.lm_head.weight, state["lm_head.weight"])
    after = engine.generate(mixed_requests[1:2], params)[0]
    assert after.logprobs != before.logprobs
    with pytest.raises(KeyError, match="missing"):
        engine.update_weights({"lm_head.weight": state["lm_head.weight"]})
    with pytest.raises(KeyError, match=r"unknown \['not.a.weight'\]"):
        engine.update_weights({**state, "not.a.weight": torch.zeros(1)})


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_hf_never_generates_media_placeholders(tiny_model, tiny_processor, mixed_requests, temperature):
    config = tiny_model.config
    media = [config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id]

    def favour_media(module, inputs, logits):
        logits[..., media] += 50.0  # the model now "wants" a placeholder at every step
        return logits

    hook = tiny_model.lm_head.register_forward_hook(favour_media)
    try:
        generations = HFEngine(tiny_model, tiny_processor).generate(
            mixed_requests, SamplingParams(max_new_tokens=8, temperature=temperature, seed=2))
        for request, generation in zip(mixed_requests, generations):
            assert not set(generation.token_ids) & set(media)
            # recorded logprobs stay the full-vocabulary ones a teacher-forced pass computes
            expected = teacher_forced_logprobs(tiny_model, request, generation.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)
            assert max(generation.logprobs) < -10  # the placeholders took nearly all the mass
    finally:
        hook.remove()


def test_rollout_on_hf_engine_logprobs_match_teacher_forcing(tiny_model, tiny_processor, short_video):
    """Real sub-agents on the tiny model behind a scripted main agent: multi-turn context and
    sub-agent trajectories both agree with a teacher-forced pass at the sampling temperature."""
    hf = HFEngine(tiny_model, tiny_processor)
    main = ScriptedEngine(tiny_processor, [calls_turn([(0, 3), (3, 8)]), ANSWER])
    cfg = rollout_cfg(subagent_max_new_tokens=12)
    episodes = run_episodes(main, tiny_processor, [one_prompt(short_video)], cfg, VIDEO_CFG, group_size=2,
                            temperature=0.7, seed=0, subagent_engine=hf)
    for episode in episodes:
        assert len(episode.subagents) == 2
        for trajectory in episode.subagents:
            request = GenerationRequest(trajectory.prompt_ids.tolist(), trajectory.vision)
            expected = teacher_forced_logprobs(tiny_model, request, trajectory.generated_ids.tolist(), 0.7)
            torch.testing.assert_close(trajectory.logprobs, expected, atol=1e-4, rtol=0)
            assert trajectory.response in "".join(s.text for s in episode.transcript)


def test_rollout_with_the_hf_main_agent_is_consistent(tiny_model, tiny_processor, short_video):
    engine = HFEngine(tiny_model, tiny_processor)
    cfg = rollout_cfg(max_new_tokens=20)
    episodes = run_episodes(engine, tiny_processor, [one_prompt(short_video)], cfg, VIDEO_CFG, group_size=2,
                            temperature=0.7, seed=1)
    for episode in episodes:
        mask = episode.loss_mask.bool()
        request = GenerationRequest(episode.token_ids[: episode.prompt_length].tolist(), episode.vision)
        full = teacher_forced_logprobs(tiny_model, request, episode.token_ids[episode.prompt_length:].tolist(), 0.7)
        torch.testing.assert_close(episode.old_logprobs[episode.prompt_length:][mask[episode.prompt_length:]],
                                   full[mask[episode.prompt_length:]], atol=1e-4, rtol=0)
        assert "".join(s.text for s in episode.transcript) == tiny_processor.tokenizer.decode(
            episode.token_ids[episode.prompt_length:])


@pytest.mark.gpu
def test_sglang_greedy_matches_hf(tiny_model_dir, tiny_processor, mixed_requests, tmp_path):
    pytest.importorskip("sglang")
    from paravt_core.agent.sglang_engine import SGLangEngine, launch_sglang_server
    from paravt_core.model.loading import load_model

    server = launch_sglang_server(tiny_model_dir, port=30123, mem_fraction_static=0.3)
    try:
        sglang = SGLangEngine.for_processor(server.url, tiny_model_dir, tmp_path / "weights", tiny_processor)
        hf = HFEngine(load_model(tiny_model_dir, device="cuda"), tiny_processor)
        params = SamplingParams(max_new_tokens=16)
        for ours, theirs in zip(hf.generate(mixed_requests, params), sglang.generate(mixed_requests, params)):
            assert ours.token_ids == theirs.token_ids
            torch.testing.assert_close(torch.tensor(theirs.logprobs), torch.tensor(ours.logprobs), atol=2e-2, rtol=0)
    finally:
        server.stop()


def _server_ids(processor, messages, tools) -> list[int]:
    """Token ids a server computes from OpenAI chat messages: its chat template, then its
    processor over the decoded JPEG images (what SGLang / vLLM do with image_url items)."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    images = []
    for message in messages:
        for item in message["content"] if isinstance(message["content"], list) else []:
            if item["type"] == "image_url":
                data = base64.b64decode(item["image_url"]["url"].split(",", 1)[1])
                images.append(np.array(Image.open(io.BytesIO(data)).convert("RGB")))
    text = processor.apply_chat_template(messages, tools=list(tools) or None, tokenize=False,
                                         add_generation_prompt=True)
    return processor(text=[text], images=images or None, return_tensors="pt")["input_ids"][0].tolist()


def test_embedded_and_server_paths_give_the_same_token_layout(tiny_processor, short_video):
    """SPEC §1: the same frames reach the model as the same timestamps and image pads on the
    embedded path (rollouts, sub-agents, hf eval) and on the server path (openai eval)."""
    import copy
    from contextlib import ExitStack

    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.dispatch import CropJob, CropRunner, CropSource
    from paravt_core.agent.prompts import subagent_messages
    from paravt_core.agent.rollout import prepare_prompt
    from paravt_core.eval.openai_engine import chat_messages, frame_items
    from paravt_core.model.loading import pixel_bounded

    renderer = ChatRenderer(tiny_processor, think_prefix=False,
                            pixel_bounds=(VIDEO_CFG.min_pixels, VIDEO_CFG.max_pixels))
    served = pixel_bounded(copy.deepcopy(tiny_processor), VIDEO_CFG)  # an exported checkpoint's processor
    prompt = one_prompt(short_video, nframes=6)
    with ExitStack() as stack:
        prepared = prepare_prompt(0, prompt, renderer, VIDEO_CFG, stack)
        overview = sample_overview_frames(short_video, 6, min_pixels=VIDEO_CFG.min_pixels,
                                          max_pixels=VIDEO_CFG.max_pixels)
        server = _server_ids(served, chat_messages(prompt, overview), prompt.tools)
        assert prepared.encoded.token_ids == server
        text = tiny_processor.tokenizer.decode(server)
        assert text.count("<|vision_start|><|image_pad|>") == 6
        assert all(f"<{t:.1f} seconds><|vision_start|>" in text for t in overview.timestamps)

        runner = CropRunner(renderer, VIDEO_CFG)
        job = CropJob(prepared.source, (2.0, 7.0), None)
        embedded_sub = runner.subagent_request(job).prompt_ids
        crop = runner.frames(job)
        content = [*frame_items(crop), *subagent_messages(2.0, 7.0)[0]["content"][1:]]
        assert embedded_sub == _server_ids(served, [{"role": "user", "content": content}], ())


def test_frames_keep_the_spec_pixel_budget_under_qwen3_vls_own_image_bounds(tiny_processor, short_video):
    """Qwen3-VL's image processor (shortest_edge 65536), which the tiny kit keeps, would upscale
    every frame below 65536 pixels. The rollout must hand it SPEC §3's bounds."""
    from contextlib import ExitStack

    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.rollout import prepare_prompt

    real_like = tiny_processor
    overview = sample_overview_frames(short_video, 3, min_pixels=VIDEO_CFG.min_pixels, max_pixels=VIDEO_CFG.max_pixels)
    _, height, width, _ = overview.array.shape
    bounded = ChatRenderer(real_like, think_prefix=False, pixel_bounds=(VIDEO_CFG.min_pixels, VIDEO_CFG.max_pixels))
    unbounded = ChatRenderer(real_like, think_prefix=False)
    with ExitStack() as stack:
        kept = prepare_prompt(0, one_prompt(short_video, nframes=3), bounded, VIDEO_CFG, stack).encoded
        upscaled = prepare_prompt(0, one_prompt(short_video, nframes=3), unbounded, VIDEO_CFG, stack).encoded
    assert kept.vision.image_grid_thw.tolist() == [[1, height // 16, width // 16]] * 3
    assert upscaled.vision.image_grid_thw[0].prod() > kept.vision.image_grid_thw[0].prod()  # what the bounds prevent
    assert len(upscaled.token_ids) > len(kept.token_ids)
