"""The agentic rollout of SPEC §3: a batch of prompts x group size, turn by turn.

`run_episodes` plays every episode of the batch in lock step:
1. Once per prompt: open its video, decode `nframes` overview frames (the prompt's own
   `nframes` when set: nFrames gating, SPEC §5), render them as K timestamped image items
   (SPEC §1, `agent/media.py`, the same rendering as the server path) and tokenize the
   prompt. All rollouts of the group share these ids and the same processed pixels (SPEC §3).
2. Each turn, the main-agent generations of all unfinished episodes go to the engine in
   one call; each generation prompt ends with `<think>\\n` when `think_prefix` is on.
3. Each generation is parsed block by block (SPEC §2). The episode ends when it holds no
   call block, when it ran out of tokens (`max_new_tokens`), or when it was the final
   generation (after `max_turns` tool rounds): the well-formed calls of such a generation
   are not executed and count as `unanswered_calls`.
4. Otherwise the turn's calls are planned (`dispatch.plan_tool_round`: errors for
   malformed blocks, calls past `max_parallel` and invalid windows) and the sub-agent
   generations of ALL episodes' calls go to the engine in ONE call.
5. All tool responses of a turn are appended as ONE user turn, one `<tool_response>` per
   call in call order, as token deltas (`context.py`), then the next turn begins.
6. Evaluation only (SPEC §7): a prompt's `forced_answer` is added after the tool responses
   of the last allowed round as a user turn of the same delta; the final generation then
   gets its token budget (main-agent calls are grouped by budget) and no think prefix
   unless the `ForcedAnswer` asks for it.

Loss mask 1 on policy-generated tokens only; old logprobs aligned to the ids (0.0 where
masked); the transcript keeps every segment after the prompt with its `generated` flag
so the reward can score either scope of SPEC §4.5. Sub-agent trajectories are kept with
their prompts for training (SPEC §5 `subagents.train`).

Where this departs from the release (SPEC §2, §3): per-block parsing instead of dropping
the turn's calls on one malformed block; token deltas instead of re-rendering and
slicing; a call always reads the episode's own video; overview frames really follow the
per-prompt `nframes`.

Points the SPEC leaves open, decided here:
- `parse_failures` counts malformed blocks of every generation, the final one included;
  `unanswered_calls` counts only well-formed calls that were never executed (final
  generation, or a generation cut by `max_new_tokens`); `rejected_calls` counts
  well-formed calls answered with an error (past `max_parallel`, invalid window).
- A generation cut by `max_new_tokens` ends the episode: its turn is unterminated, so no
  tool turn can follow it.
- Tool-response text has special-token strings removed before truncation, so a summary
  cannot inject `<|im_start|>` or `<|video_pad|>` into the main agent's context.
- Crops (sub-agent prompts, `frames` tool mode) are timestamped image items like the
  overview, so a 1-frame crop is one image.
- Transcript segments are the exact text of their tokens, chat markers included (a
  tool turn reads "\\n<|im_start|>user\\n<tool_response>...<|im_start|>assistant\\n<think>\\n"),
  so `"".join(...)` equals the decoded context after the prompt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from paravt_core.agent.context import TURN_END_TOKEN, ChatRenderer, Encoded, TokenContext
from paravt_core.agent.dispatch import (
    CropJob,
    CropResult,
    CropRunner,
    CropSource,
    EndReason,
    PlannedCall,
    ToolMode,
    episode_end,
    plan_tool_round,
)
from paravt_core.agent.engine import Generation, GenerationRequest, RolloutEngine, SamplingParams, VisionInputs
from paravt_core.agent.media import clip_items, with_frames
from paravt_core.agent.prompts import EpisodePrompt
from paravt_core.agent.tool_calls import parse_tool_calls
from paravt_core.config import RolloutConfig, VideoConfig
from paravt_core.rewards import EMPTY_TOOL_RESPONSE, RewardScope, TranscriptSegment, scored_text
from paravt_core.video import VideoFile, sample_overview_frames
from paravt_core.video.errors import VideoDecodeError

logger = logging.getLogger(__name__)


@dataclass
class SubagentTrajectory:
    """One sub-agent run: its prompt (that window's frames + the SPEC §3 request) and summary."""

    turn: int  # the main agent's tool round, from 0
    call_index: int  # the call block's index within that turn
    window: tuple[float, float]  # seconds
    prompt_ids: torch.Tensor  # [P] int64, window frames expanded
    generated_ids: torch.Tensor  # [G] int64, ends with the stop token when it stopped
    logprobs: torch.Tensor  # [G] float32, under the sampling distribution
    vision: VisionInputs
    finish_reason: str
    response: str  # the tool-response text the main agent received

    @property
    def token_ids(self) -> torch.Tensor:  # [P + G]
        return torch.cat([self.prompt_ids, self.generated_ids])

    @property
    def loss_mask(self) -> torch.Tensor:  # [P + G], 1 on generated tokens
        return torch.cat([torch.zeros_like(self.prompt_ids), torch.ones_like(self.generated_ids)])

    @property
    def old_logprobs(self) -> torch.Tensor:  # [P + G], 0.0 on the prompt
        return torch.cat([torch.zeros(self.prompt_ids.numel()), self.logprobs])


@dataclass
class Episode:
    """One main-agent rollout with everything RL needs from it.

    Attributes:
        prompt_length: tokens of the rendered prompt (overview expanded), before the
            first forced think prefix.
        vision: processed pixels of every video in `token_ids`, in order (the group's
            shared overview, plus crops in `frames` tool mode).
        transcript: segments after the prompt in order; "".join of their texts is the
            transcript of SPEC §4.5 (video placeholders unexpanded).
        turns: main-agent generations.
        tool_calls: calls answered by a sub-agent (or by frames), i.e. executed.
        rejected_calls: well-formed calls answered with an error (past max_parallel,
            invalid window).
        unanswered_calls: well-formed calls in a generation that was not executed.
        end_reason: "answer" (no call block), "length" (max_new_tokens hit), "max_turns".
    """

    prompt_id: str
    prompt_index: int
    sample_index: int
    nframes: int
    token_ids: torch.Tensor  # [L] int64
    loss_mask: torch.Tensor  # [L] int64
    old_logprobs: torch.Tensor  # [L] float32
    prompt_length: int
    vision: VisionInputs
    transcript: list[TranscriptSegment]
    turns: int
    tool_calls: int
    parse_failures: int
    rejected_calls: int
    unanswered_calls: int
    end_reason: EndReason
    subagents: list[SubagentTrajectory]

    def text(self, scope: RewardScope = "generated") -> str:
        """The text the reward scores (SPEC §4.5)."""
        return scored_text(self.transcript, scope)


@dataclass(eq=False)
class PreparedPrompt:
    """A prompt's overview, ids and pixels: computed once, shared by its group (SPEC §3)."""

    index: int
    prompt: EpisodePrompt
    nframes: int
    encoded: Encoded
    source: CropSource
    messages: list[dict[str, Any]]  # the prompt's messages, overview as timestamped image items


def prepare_prompt(index: int, prompt: EpisodePrompt, renderer: ChatRenderer, video_cfg: VideoConfig,
                   stack: ExitStack) -> PreparedPrompt:
    """Open the prompt's video (closed with `stack`), decode its overview, tokenize the prompt
    with the overview as K timestamped image items (SPEC §1, `agent/media.py`)."""
    video = stack.enter_context(VideoFile(prompt.video_path))
    nframes = prompt.nframes or video_cfg.nframes
    overview = sample_overview_frames(video, nframes, min_pixels=video_cfg.min_pixels, max_pixels=video_cfg.max_pixels)
    messages = with_frames(prompt.messages, [overview])
    text = renderer.prompt_text(messages, prompt.tools)
    encoded = renderer.encode(text, [overview], continuation=False)
    return PreparedPrompt(index, prompt, nframes, encoded, CropSource(index, video, overview.duration), messages)


@dataclass
class _Counters:
    tool_calls: int = 0
    parse_failures: int = 0
    rejected_calls: int = 0
    unanswered_calls: int = 0


@dataclass(eq=False)
class _EpisodeState:
    """A live episode: its context, the chat history the template renders, its counters."""

    prepared: PreparedPrompt
    sample_index: int
    context: TokenContext
    history: list[dict[str, Any]]
    counters: _Counters = field(default_factory=_Counters)
    subagents: list[SubagentTrajectory] = field(default_factory=list)
    turns: int = 0
    end_reason: EndReason | None = None
    next_max_new_tokens: int | None = None  # set by a forced-answer turn (SPEC §7)

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def request(self) -> GenerationRequest:
        return GenerationRequest(list(self.context.token_ids), self.context.vision)

    def to_episode(self) -> Episode:
        assert self.end_reason is not None, "the final turn always ends an episode"
        ids, mask, logprobs = self.context.tensors()
        return Episode(
            prompt_id=self.prepared.prompt.prompt_id, prompt_index=self.prepared.index,
            sample_index=self.sample_index, nframes=self.prepared.nframes, token_ids=ids, loss_mask=mask,
            old_logprobs=logprobs, prompt_length=self.context.prompt_length, vision=self.context.vision,
            transcript=list(self.context.transcript), turns=self.turns, tool_calls=self.counters.tool_calls,
            parse_failures=self.counters.parse_failures, rejected_calls=self.counters.rejected_calls,
            unanswered_calls=self.counters.unanswered_calls, end_reason=self.end_reason,
            subagents=self.subagents)


class _Rollout:
    """The turn loop of `run_episodes`; holds the renderer, configs and sampling knobs."""

    def __init__(self, engine: RolloutEngine, subagent_engine: RolloutEngine, renderer: ChatRenderer,
                 rollout_cfg: RolloutConfig, runner: CropRunner, temperature: float, top_p: float,
                 seed: int | None, batched_subagents: bool):
        self.engine, self.subagent_engine = engine, subagent_engine
        self.renderer, self.cfg, self.runner = renderer, rollout_cfg, runner
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.batched_subagents = batched_subagents

    def start(self, prepared: PreparedPrompt, sample_index: int) -> _EpisodeState:
        context = TokenContext.from_prompt(prepared.encoded)
        prefix = self.renderer.generation_prefix
        if prefix:
            context.append_forced(self.renderer.encode(prefix), prefix)
        return _EpisodeState(prepared, sample_index, context, [dict(m) for m in prepared.messages])

    def params(self, turn: int, subagent: bool, max_new_tokens: int | None = None) -> SamplingParams:
        max_new = self.cfg.subagent_max_new_tokens if subagent else self.cfg.max_new_tokens
        max_new = max_new_tokens or max_new
        seed = None if self.seed is None else self.seed * 1_000_003 + 2 * turn + int(subagent)
        return SamplingParams(max_new_tokens=max_new, temperature=self.temperature, top_p=self.top_p,
                              stop_token_ids=(self.renderer.turn_end_id,), seed=seed)

    def play_turn(self, states: Sequence[_EpisodeState], turn: int) -> None:
        """One main-agent generation for every live episode, then one tool round for all."""
        generations = self.generate_main(states, turn)
        plans = [self.take_generation(state, generation, turn) for state, generation in zip(states, generations)]
        rounds = [(state, plan) for state, plan in zip(states, plans) if plan is not None]
        jobs = [CropJob(state.prepared.source, call.window, call.num_frames)
                for state, plan in rounds for call in plan if call.runs]
        results = iter(self.runner.run(self.subagent_engine, jobs, self.params(turn, True), self.batched_subagents))
        for state, plan in rounds:
            answered = [None if not call.runs else next(results) for call in plan]
            self.append_tool_round(state, plan, answered, turn)
        logger.info("turn %d: %d episodes generated, %d with a tool round, %d calls executed", turn,
                    len(states), len(rounds), len(jobs))

    def generate_main(self, states: Sequence[_EpisodeState], turn: int) -> list[Generation]:
        """The main-agent generations of a turn, in state order: one engine call per token
        budget (one call unless a forced-answer turn set a smaller budget for some states)."""
        budgets = [state.next_max_new_tokens or self.cfg.max_new_tokens for state in states]
        generations: list[Generation | None] = [None] * len(states)
        for budget in sorted(set(budgets)):
            rows = [row for row, row_budget in enumerate(budgets) if row_budget == budget]
            outputs = self.engine.generate([states[row].request() for row in rows], self.params(turn, False, budget))
            for row, generation in zip(rows, outputs):
                generations[row] = generation
        return generations

    def take_generation(self, state: _EpisodeState, generation: Generation, turn: int) -> list[PlannedCall] | None:
        """Append a generation; return the planned tool round, or None when the episode ends."""
        text = self.renderer.decode(generation.token_ids)
        state.context.append_generated(generation.token_ids, generation.logprobs, text)
        state.history.append({"role": "assistant", "content": self._assistant_content(text)})
        state.turns += 1
        blocks = parse_tool_calls(text)
        state.counters.parse_failures += sum(1 for block in blocks if not block.ok)
        well_formed = sum(1 for block in blocks if block.ok)
        ended_turn = bool(generation.token_ids) and generation.token_ids[-1] == self.renderer.turn_end_id
        state.end_reason = episode_end(blocks, not ended_turn, turn, self.cfg.max_turns)
        if state.end_reason is None:
            return plan_tool_round(blocks, state.prepared.source.duration, self.cfg.max_parallel)
        state.counters.unanswered_calls += well_formed
        return None

    def _assistant_content(self, text: str) -> str:
        # Only the text render of the history uses this (for the template's suffixes);
        # the ids always stay the generated ones.
        body = text.removesuffix(TURN_END_TOKEN)
        return self.renderer.generation_prefix + body

    def append_tool_round(self, state: _EpisodeState, plan: Sequence[PlannedCall],
                          answered: Sequence[CropResult | None], turn: int) -> None:
        """Append the turn's tool responses as one user turn of token deltas (SPEC §3)."""
        messages, clips = [], []
        for call, result in zip(plan, answered):
            text = self.renderer.tool_response_text(call.error if result is None else result.text,
                                                    self.cfg.tool_response_max_tokens)
            if result is not None and result.frames is not None:
                clips.append(result.frames)
                messages.append({"role": "tool", "content": [*clip_items(result.frames), {"type": "text", "text": text}]})
            else:
                messages.append({"role": "tool", "content": text})
            if result is not None and result.generation is not None:
                state.subagents.append(_trajectory(turn, call, result, text))
        self._count_round(state, plan)
        forced = state.prepared.prompt.forced_answer if turn == self.cfg.max_turns - 1 else None
        if forced is not None:
            messages.append({"role": "user", "content": forced.text})
            state.next_max_new_tokens = forced.max_new_tokens
        delta_text = self.renderer.after_turn_end + self.renderer.turn_text(
            state.history, messages, state.prepared.prompt.tools)
        if forced is not None and not forced.think_prefix and self.renderer.generation_prefix:
            delta_text = delta_text.removesuffix(self.renderer.generation_prefix)
        # SPEC §4.5: the transcript scope sees each response as an empty marker, never its body.
        prefix = self.renderer.generation_prefix if delta_text.endswith(self.renderer.generation_prefix) else ""
        scored = EMPTY_TOOL_RESPONSE * sum(1 for m in messages if m["role"] == "tool") + prefix
        state.context.append_forced(self.renderer.encode(delta_text, clips), delta_text, scored)
        state.history.extend(messages)

    @staticmethod
    def _count_round(state: _EpisodeState, plan: Sequence[PlannedCall]) -> None:
        # malformed blocks were counted as parse failures when the generation was taken
        state.counters.tool_calls += sum(1 for call in plan if call.runs)
        state.counters.rejected_calls += sum(call.rejected_calls for call in plan)


def _trajectory(turn: int, call: PlannedCall, result: CropResult, response: str) -> SubagentTrajectory:
    assert result.request is not None and result.generation is not None and call.window is not None
    return SubagentTrajectory(
        turn=turn, call_index=call.block_index, window=call.window,
        prompt_ids=torch.tensor(result.request.prompt_ids, dtype=torch.long),
        generated_ids=torch.tensor(result.generation.token_ids, dtype=torch.long),
        logprobs=torch.tensor(result.generation.logprobs, dtype=torch.float32),
        vision=result.request.vision, finish_reason=result.generation.finish_reason, response=response)


def run_episodes(
    engine: RolloutEngine,
    processor: Any,
    prompts: Sequence[EpisodePrompt],
    rollout_cfg: RolloutConfig,
    video_cfg: VideoConfig,
    *,
    group_size: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    tool_mode: ToolMode = "subagent",
    subagent_engine: RolloutEngine | None = None,
    batched_subagents: bool = True,
) -> list[Episode]:
    """Roll out `group_size` episodes of every prompt (SPEC §3); episodes prompt-major.

    Args:
        engine: the main agent's engine.
        processor: the model's Qwen3-VL processor (chat template, tokenizer, video processor).
        prompts: the batch; each prompt's `nframes` overrides `video_cfg.nframes`.
        rollout_cfg: max_turns, max_parallel, tool_response_max_tokens, think_prefix,
            max_new_tokens, subagent_max_new_tokens.
        video_cfg: overview pixel bounds and crop fps / frame counts.
        temperature, top_p, seed: sampling of main agent and sub-agents alike (0 = greedy).
        tool_mode: "subagent" (training: summaries as text) or "frames" (crops' frames go
            to the main agent, SPEC §7).
        subagent_engine: engine for the sub-agents; None shares the main agent's engine
            (weight sharing, SPEC §1).
        batched_subagents: False sends each sub-agent alone (one engine call per crop), to
            measure what batching buys.

    Returns:
        Episodes in order prompt 0 samples 0..G-1, prompt 1 samples 0..G-1, ...
    """
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    renderer = ChatRenderer(processor, rollout_cfg.think_prefix, (video_cfg.min_pixels, video_cfg.max_pixels))
    runner = CropRunner(renderer, video_cfg, tool_mode)
    rollout = _Rollout(engine, subagent_engine or engine, renderer, rollout_cfg, runner, temperature, top_p,
                       seed, batched_subagents)
    started = time.perf_counter()
    with ExitStack() as stack:
        prepared = [prepare_prompt(index, prompt, renderer, video_cfg, stack) for index, prompt in enumerate(prompts)]
        states = [rollout.start(item, sample) for item in prepared for sample in range(group_size)]
        for turn in range(rollout_cfg.max_turns + 1):
            live = [state for state in states if not state.done]
            if not live:
                break
            rollout.play_turn(live, turn)
    logger.info("rolled out %d episodes of %d prompts in %.2f s", len(states), len(prompts),
                time.perf_counter() - started)
    return [state.to_episode() for state in states]


PromptT = TypeVar("PromptT")


def run_dropping_undecodable(prompts: Sequence[PromptT], run: Callable[[list[PromptT]], list],
                             video_of: Callable[[PromptT], Any], undecodable: set[str],
                             warn: Callable[[str], None] = print, who: str = "rollout") -> tuple[list[PromptT], list]:
    """(prompts kept, `run(kept)`) without the prompts whose video does not decode.

    The one mechanism every model-consuming stage uses for a video that fails mid-stream
    (RL steps, the SFT grammar check): `run` raises `VideoDecodeError` naming the file, the
    prompts of that video are set aside and the rest run again. `undecodable` (video paths)
    is read and extended, so a caller that runs again (the next RL step, the next checkpoint
    of a grammar check) skips those videos at once.

    Raises:
        ValueError: no prompts were given (not a decoding failure: there was nothing to decode).
        VideoDecodeError: no prompt is left, or the failing video is not one of the prompts'.
    """
    if not prompts:
        # Told apart from "every video failed": an empty list used to read "no prompt has a video
        # that decodes ... undecodable so far: []" (issue #48 item 3).
        raise ValueError(f"{who}: given no prompts at all, so there is nothing to roll out")
    kept = [p for p in prompts if str(video_of(p)) not in undecodable]
    while True:
        if not kept:
            raise VideoDecodeError(video_of(prompts[0]),
                                   f"no prompt of this {who} has a video that decodes",
                                   f"Check the videos; undecodable so far: {sorted(undecodable)}")
        try:
            return kept, run(kept)
        except VideoDecodeError as error:
            if error.path in undecodable or not any(str(video_of(p)) == error.path for p in kept):
                raise
            undecodable.add(error.path)
            dropped = [p for p in kept if str(video_of(p)) == error.path]
            kept = [p for p in kept if str(video_of(p)) != error.path]
            warn(f"warning: {who} sets aside {len(dropped)} prompt(s) whose video does not decode "
                 f"(and skips it from now on): {error}")
