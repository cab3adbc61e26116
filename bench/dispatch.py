"""Parallel vs sequential dispatch of one turn's crop calls, on the hf backend (SPEC §3).

The tiny Qwen3-VL (built into a temporary directory) and a generated 60 s video. For
1..5 crop calls of one turn (8 s windows, 1 fps crops = 8 frames each), median wall time
of --repeats runs, the two modes interleaved:
  tool round  `CropRunner.run` with a fresh cache: decode every window, build every
              sub-agent prompt, generate every summary, build the response texts.
              parallel = all sub-agent generations in ONE engine call (what the rollout
              does); sequential = one engine call per crop call, one after another.
  episode     `run_episodes` with max_turns 1: prompt, the scripted tool-call turn, the
              tool round, and the main agent's next generation on the model.
The random tiny model never writes a tool call itself, so the main agent's FIRST turn is
scripted (N crop calls); the sub-agents and the main agent's next turn run on the model.
Greedy decoding, so both modes generate the same tokens.

Then the rollout share of one simplified RL step (--step-prompts x --step-group episodes,
3 crop calls each, sampled at temperature 0.7): rollout (`run_episodes`), reference (one
no-grad forward per main and sub-agent sequence), train (one forward/backward per
sequence of a masked policy-gradient loss, then an Adam step). Not the RL stage's loss;
it only sizes the rollout against the passes a step must make anyway.

Torch runs single-threaded by default (--threads): on a small shared CPU two threads
made single `generate` calls vary from 0.06 s to 5 s under load from other processes.

Run: `.venv/bin/python bench/dispatch.py [--repeats 5] [--threads 1]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np
import torch

from paravt_core.agent.context import ChatRenderer
from paravt_core.agent.dispatch import CropJob, CropRunner, CropSource
from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams
from paravt_core.agent.hf_engine import HFEngine
from paravt_core.agent.prompts import question_prompt
from paravt_core.agent.rollout import Episode, run_episodes
from paravt_core.config import RolloutConfig, VideoConfig
from paravt_core.model.loading import load_model, load_processor
from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
from paravt_core.video import VideoFile

VIDEO_SECONDS, VIDEO_FPS, VIDEO_SIZE = 60, 4, (96, 128)
WINDOW_SECONDS = 8.0
VIDEO_CFG = VideoConfig(nframes=16, max_pixels=128 * 96)
MAX_CALLS = 5


def write_video(path: Path) -> Path:
    """A 60 s, 4 fps, 128x96 mp4: a white square crossing a background whose colour drifts."""
    height, width = VIDEO_SIZE
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=VIDEO_FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(VIDEO_SECONDS * VIDEO_FPS):
            frame = np.zeros((height, width, 3), dtype=np.uint8)  # [H, W, 3]
            frame[..., 0], frame[..., 2] = (3 * i) % 256, 255 - (3 * i) % 256
            x = (2 * i) % (width - 16)
            frame[40:56, x : x + 16] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def windows(n_calls: int) -> list[tuple[float, float]]:
    step = (VIDEO_SECONDS - WINDOW_SECONDS) / max(n_calls - 1, 1)
    return [(round(i * step, 1), round(i * step, 1) + WINDOW_SECONDS) for i in range(n_calls)]


def tool_call_turn(n_calls: int) -> str:
    calls = "".join(
        f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "v.mp4", "start_time": {s}, '
        f'"end_time": {e}}}}}</tool_call>' for s, e in windows(n_calls))
    return "I should look at several moments.\n</think>\n" + calls


class ScriptedFirstTurn:
    """Main-agent engine of the bench: its first call answers every request with the scripted
    tool-call turn (the random model never calls tools); later calls go to the model."""

    def __init__(self, model_engine: HFEngine, processor, first_turn: str):
        self.model_engine = model_engine
        tokenizer = processor.tokenizer
        self._first_ids = tokenizer(first_turn, add_special_tokens=False)["input_ids"] + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self._first_done = False

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        if self._first_done:
            return self.model_engine.generate(requests, params)
        self._first_done = True
        return [Generation(list(self._first_ids), [0.0] * len(self._first_ids), "stop") for _ in requests]

    def update_weights(self, state_dict) -> None:
        self.model_engine.update_weights(state_dict)


def time_tool_round(engine: HFEngine, renderer: ChatRenderer, cfg: RolloutConfig, video: Path, n_calls: int,
                    batched: bool) -> float:
    params = SamplingParams(max_new_tokens=cfg.subagent_max_new_tokens, stop_token_ids=(renderer.turn_end_id,))
    runner = CropRunner(renderer, VIDEO_CFG)
    with VideoFile(video) as opened:
        source = CropSource(0, opened, opened.info.duration)
        jobs = [CropJob(source, window) for window in windows(n_calls)]
        started = time.perf_counter()
        results = runner.run(engine, jobs, params, batched=batched)
        elapsed = time.perf_counter() - started
    assert len(results) == n_calls
    return elapsed


def time_episode(engine: HFEngine, processor, cfg: RolloutConfig, video: Path, n_calls: int, batched: bool) -> float:
    main = ScriptedFirstTurn(engine, processor, tool_call_turn(n_calls))
    prompt = question_prompt("bench", video, "What colour is the background when the square is at the left?")
    started = time.perf_counter()
    (episode,) = run_episodes(main, processor, [prompt], cfg, VIDEO_CFG, subagent_engine=engine,
                              batched_subagents=batched)
    elapsed = time.perf_counter() - started
    assert episode.tool_calls == n_calls and episode.turns == 2, (episode.tool_calls, episode.turns)
    return elapsed


def dispatch_table(engine: HFEngine, processor, cfg: RolloutConfig, video: Path, repeats: int) -> None:
    renderer = ChatRenderer(processor, cfg.think_prefix)
    print(f"\nOne turn's crop calls on the tiny model: median of {repeats} runs, seconds "
          f"(sub-agent max_new_tokens {cfg.subagent_max_new_tokens}, main {cfg.max_new_tokens}, greedy)")
    print(f"{'calls':>5} | {'round par':>9} {'round seq':>9} {'par/seq':>7} | {'episode par':>11} "
          f"{'episode seq':>11} {'par/seq':>7}")
    for n_calls in range(1, MAX_CALLS + 1):
        rounds: dict[bool, list[float]] = {True: [], False: []}
        episodes: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(repeats):
            for batched in (True, False):
                rounds[batched].append(time_tool_round(engine, renderer, cfg, video, n_calls, batched))
                episodes[batched].append(time_episode(engine, processor, cfg, video, n_calls, batched))
        rp, rs = statistics.median(rounds[True]), statistics.median(rounds[False])
        ep, es = statistics.median(episodes[True]), statistics.median(episodes[False])
        print(f"{n_calls:>5} | {rp:>9.3f} {rs:>9.3f} {rp / rs:>7.2f} | {ep:>11.3f} {es:>11.3f} {ep / es:>7.2f}")


def sequences_of(episode: Episode):
    """(ids [L], loss mask [L], vision) of the main agent and of each sub-agent."""
    yield episode.token_ids, episode.loss_mask, episode.vision
    for trajectory in episode.subagents:
        yield trajectory.token_ids, trajectory.loss_mask, trajectory.vision


def masked_logprobs(model, ids: torch.Tensor, vision) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1: [L - 1]."""
    batch = ids[None]
    token_types = (batch == model.config.video_token_id).long() * 2
    logits = model(input_ids=batch, attention_mask=torch.ones_like(batch), mm_token_type_ids=token_types,
                   **vision.as_kwargs()).logits[0, :-1]  # [L - 1, V]
    return torch.log_softmax(logits.float(), -1).gather(1, ids[1:, None])[:, 0]


def step_share(model_dir: Path, processor, cfg: RolloutConfig, video: Path, prompts: int, group: int) -> None:
    policy, reference = load_model(model_dir), load_model(model_dir).eval()
    engine = HFEngine(policy, processor)
    main = ScriptedFirstTurn(engine, processor, tool_call_turn(3))
    batch = [question_prompt(f"q{i}", video, f"Question {i}: what happens to the square?") for i in range(prompts)]
    started = time.perf_counter()
    episodes = run_episodes(main, processor, batch, cfg, VIDEO_CFG, group_size=group, temperature=0.7, seed=0,
                            subagent_engine=engine)
    rollout_s = time.perf_counter() - started
    sequences = [seq for episode in episodes for seq in sequences_of(episode)]
    started = time.perf_counter()
    with torch.no_grad():
        for ids, _, vision in sequences:
            masked_logprobs(reference, ids, vision)
    reference_s = time.perf_counter() - started
    optimizer = torch.optim.Adam(policy.parameters(), lr=2e-6)
    started = time.perf_counter()
    policy.train()
    advantages = torch.randn(len(sequences))
    for (ids, mask, vision), advantage in zip(sequences, advantages):
        logprobs = masked_logprobs(policy, ids, vision)
        weights = mask[1:].float()
        loss = -(advantage * logprobs * weights).sum() / weights.sum().clamp(min=1)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    train_s = time.perf_counter() - started
    total = rollout_s + reference_s + train_s
    calls = sum(e.tool_calls for e in episodes)
    print(f"\nSimplified RL step: {prompts} prompts x {group} samples, {calls} crop calls, "
          f"{len(sequences)} sequences (main + sub-agent)")
    print(f"rollout {rollout_s:.2f} s | reference {reference_s:.2f} s | train {train_s:.2f} s | "
          f"rollout share {rollout_s / total:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--subagent-tokens", type=int, default=64)
    parser.add_argument("--main-tokens", type=int, default=64)
    parser.add_argument("--step-prompts", type=int, default=2)
    parser.add_argument("--step-group", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = RolloutConfig(max_turns=1, max_new_tokens=args.main_tokens, subagent_max_new_tokens=args.subagent_tokens)
    with tempfile.TemporaryDirectory(prefix="paravt-bench-dispatch-") as tmp:
        model_dir = build_tiny_model(TinyModelSpec(), Path(tmp) / "tiny")
        processor = load_processor(model_dir)
        video = write_video(Path(tmp) / "video.mp4")
        engine = HFEngine(load_model(model_dir), processor)
        print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} "
              f"on {os.cpu_count()} CPUs")
        time_tool_round(engine, ChatRenderer(processor, True), cfg, video, 1, True)  # warm-up
        dispatch_table(engine, processor, cfg, video, args.repeats)
        step_share(model_dir, processor, cfg, video, args.step_prompts, args.step_group)


if __name__ == "__main__":
    main()
