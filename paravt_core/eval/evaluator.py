"""The SPEC §7 evaluator: a split's samples through an engine, scored, logged durably, summarized.

`evaluate_split(split, samples, runner, results_dir)`:
1. reads `<results_dir>/<split>.jsonl` and skips every sample already in it (a killed run
   resumes where it stopped; a torn last line is dropped, `results.ResultsLog`);
2. runs the remaining samples through a `SampleRunner`, which yields each sample's
   `EpisodeOutcome` as soon as it is done; each is scored (`results.score_sample`) and
   appended to the log (one JSON line, flushed and fsynced) before the next is taken;
   A sample whose video does not decode (`VideoDecodeError`) is recorded as an error
   with score 0 (`results.video_error_outcome`) and the split goes on;
3. writes `<results_dir>/<split>.json` (per-sample records in sample order and the
   summary of `results.summarize`, with `quarantined_rows`: the rows the loader set aside,
   as {file, row, field, reason}) atomically.

Runners (the engine of `eval.engine`):
- `HFSampleRunner`: `run_episodes` on an `HFEngine` (or any `RolloutEngine`), greedy,
  group size 1; `eval.concurrency` samples are batched into ONE `run_episodes` call, so
  their generations of each turn share one batched `generate` (cut into sub-batches of at
  most `eval.hf_batch_tokens` prompt tokens when set; the same greedy tokens).
- `OpenAISampleRunner`: `openai_engine.OpenAIAgent` per sample, `eval.concurrency`
  samples at a time on a thread pool (the server batches concurrent requests itself).

Both play the SPEC §3 protocol with the evaluation settings of SPEC §7: prompt mode per
sample kind (`prompting.py`), tool mode `frames` or `subagent`, dispatch `parallel` or
`sequential` (one call per turn), `max_turns`, `max_parallel`, the forced-answer turn
after the last tool round, `nframes` overview frames, greedy decoding. The scored text
is the final main-agent generation (see `results.EpisodeOutcome`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from paravt_core.agent.context import TURN_END_TOKEN
from paravt_core.agent.engine import RolloutEngine
from paravt_core.agent.prompts import EpisodePrompt
from paravt_core.agent.rollout import Episode, run_episodes
from paravt_core.config import EvalConfig, PipelineConfig, RolloutConfig, VideoConfig
from paravt_core.eval.openai_engine import OpenAIAgent
from paravt_core.eval.prompting import PromptMode, episode_prompt, prompt_mode_for, rollout_config
from paravt_core.eval.results import (
    EpisodeOutcome,
    ResultsLog,
    SampleResult,
    score_sample,
    summarize,
    video_error_outcome,
    write_split_results,
)
from paravt_core.eval.samples import EvalSample
from paravt_core.video.errors import VideoDecodeError

logger = logging.getLogger(__name__)

PROGRESS_LOG_EVERY_S = 30.0  # without a progress bar (Prefect tasks), a log line this often


class EvalError(RuntimeError):
    """An evaluation that cannot go on; the message names the split / sample and the fix."""


@dataclass(frozen=True)
class EvalSettings:
    """The knobs of one evaluation: SPEC §7 eval settings, frame sampling, and the training
    rollout's sub-agent budget and tool-response truncation."""

    eval: EvalConfig
    video: VideoConfig
    rollout: RolloutConfig

    @classmethod
    def from_pipeline(cls, cfg: PipelineConfig) -> EvalSettings:
        return cls(cfg.eval, cfg.video, cfg.rl.rollout)

    def mode(self, sample: EvalSample) -> PromptMode:
        return prompt_mode_for(sample, self.eval)

    def prompt(self, sample: EvalSample) -> EpisodePrompt:
        return episode_prompt(sample, self.mode(sample), self.eval.dispatch, self.eval.nframes)

    def rollout_for(self, mode: PromptMode) -> RolloutConfig:
        return rollout_config(self.eval, mode, self.rollout)


class SampleRunner(Protocol):
    def outcomes(self, samples: Sequence[EvalSample]) -> Iterator[tuple[EvalSample, EpisodeOutcome]]:
        """Each sample's outcome, yielded as soon as it is done (any order)."""
        ...


def outcome_of(episode: Episode) -> EpisodeOutcome:
    """The evaluation view of a rollout episode: its final generation and counters."""
    generated = [segment.text for segment in episode.transcript if segment.generated]
    final = generated[-1].removesuffix(TURN_END_TOKEN) if generated else ""
    return EpisodeOutcome(final, episode.turns, episode.tool_calls, episode.parse_failures, episode.rejected_calls,
                          episode.unanswered_calls, episode.end_reason)


def _by_mode(samples: Sequence[EvalSample], settings: EvalSettings) -> dict[PromptMode, list[EvalSample]]:
    groups: dict[PromptMode, list[EvalSample]] = {}
    for sample in samples:
        groups.setdefault(settings.mode(sample), []).append(sample)
    return groups


def _while_evaluating(samples: Sequence[EvalSample]) -> str:
    ids = ", ".join(sample.id for sample in samples)
    return f"while evaluating split {samples[0].split}, sample(s) {ids}; finished samples are kept, re-run to resume"


def _chunks(items: Sequence[EvalSample], size: int) -> Iterator[Sequence[EvalSample]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class HFSampleRunner:
    """Batches of `eval.concurrency` samples, each batch one greedy `run_episodes` call."""

    def __init__(self, engine: RolloutEngine, processor: Any, settings: EvalSettings):
        self.engine, self.processor, self.settings = engine, processor, settings

    def outcomes(self, samples: Sequence[EvalSample]) -> Iterator[tuple[EvalSample, EpisodeOutcome]]:
        for mode, group in _by_mode(samples, self.settings).items():
            rollout_cfg = self.settings.rollout_for(mode)
            for batch in _chunks(group, self.settings.eval.concurrency):
                yield from zip(batch, self._batch_outcomes(batch, rollout_cfg))

    def _batch_outcomes(self, batch: Sequence[EvalSample], rollout_cfg: RolloutConfig) -> list[EpisodeOutcome]:
        """One batched `run_episodes`; when a video in it does not decode, the batch is run
        again sample by sample so only that sample is recorded as a video error."""
        try:
            episodes = run_episodes(self.engine, self.processor, [self.settings.prompt(s) for s in batch],
                                    rollout_cfg, self.settings.video, group_size=1, temperature=0.0,
                                    tool_mode=self.settings.eval.tool_mode)
        except VideoDecodeError as exc:
            if len(batch) > 1:
                return [outcome for sample in batch for outcome in self._batch_outcomes([sample], rollout_cfg)]
            logger.warning("split %s, sample %s: %s; recorded as an error with score 0", batch[0].split,
                           batch[0].id, exc)
            return [video_error_outcome(exc)]
        except Exception as exc:
            exc.add_note(_while_evaluating(batch))
            raise
        return [outcome_of(episode) for episode in episodes]


class OpenAISampleRunner:
    """`eval.concurrency` samples in flight on a thread pool, one `OpenAIAgent` episode each."""

    def __init__(self, client: Any, processor: Any, settings: EvalSettings):
        self.client, self.processor, self.settings = client, processor, settings
        self._agents: dict[PromptMode, Any] = {}

    def agent(self, mode: PromptMode) -> Any:
        """The `OpenAIAgent` of a prompt mode (its rollout knobs differ per mode)."""
        if mode not in self._agents:
            self._agents[mode] = OpenAIAgent(self.client, self.processor, self.settings.rollout_for(mode),
                                             self.settings.video, self.settings.eval.tool_mode)
        return self._agents[mode]

    def outcomes(self, samples: Sequence[EvalSample]) -> Iterator[tuple[EvalSample, EpisodeOutcome]]:
        pool = ThreadPoolExecutor(max_workers=self.settings.eval.concurrency, thread_name_prefix="paravt-eval")
        pending: dict[Future, EvalSample] = {}
        queue = list(samples)
        try:
            while queue or pending:
                while queue and len(pending) < self.settings.eval.concurrency:
                    sample = queue.pop(0)
                    agent = self.agent(self.settings.mode(sample))
                    pending[pool.submit(agent.run, self.settings.prompt(sample))] = sample
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                failed = [(pending[f], f.exception()) for f in done
                          if f.exception() is not None and not isinstance(f.exception(), VideoDecodeError)]
                for future in done:
                    sample = pending.pop(future)
                    if future.exception() is None:
                        yield sample, future.result()
                    elif isinstance(future.exception(), VideoDecodeError):
                        logger.warning("split %s, sample %s: %s; recorded as an error with score 0", sample.split,
                                       sample.id, future.exception())
                        yield sample, video_error_outcome(future.exception())
                if failed:  # after the finished ones are handed out (and logged)
                    sample, exc = failed[0]
                    exc.add_note(_while_evaluating([sample]))
                    raise exc
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class SplitRun:
    """One split's evaluation: its summary, the per-split JSON, and how many samples this
    call ran (the others were already in the log)."""

    split: str
    summary: dict[str, Any]
    results_json: Path
    evaluated: int


def _check_videos(split: str, samples: Sequence[EvalSample]) -> None:
    missing = [sample for sample in samples if sample.video_missing]
    if missing:
        examples = ", ".join(f"{s.id}: {s.video_path}" for s in missing[:3])
        raise EvalError(f"split {split}: {len(missing)} of {len(samples)} samples have no video file ({examples}); "
                        "re-run the data stage (flow paravt-data) to prepare the split")
    if split == "videomme_wsub":
        without = sum(1 for sample in samples if sample.subtitle_path is None)
        if without:
            logger.warning("split %s: %d of %d samples have no .srt subtitles; their questions have none", split,
                           without, len(samples))


def evaluate_split(split: str, samples: Sequence[EvalSample], runner: SampleRunner, results_dir: Path,
                   progress: bool = True, quarantined: Sequence[dict[str, Any]] = ()) -> SplitRun:
    """Evaluate the samples of `split` not yet in `<results_dir>/<split>.jsonl` (module docstring)."""
    if not samples:
        raise EvalError(f"split {split}: no samples to evaluate; check the split's rows file")
    _check_videos(split, samples)
    log = ResultsLog(Path(results_dir) / f"{split}.jsonl")
    finished = log.load()
    todo = [sample for sample in samples if sample.id not in finished]
    logger.info("split %s: %d samples, %d already in %s, %d to run", split, len(samples), len(samples) - len(todo),
                log.path, len(todo))
    started = last_log = time.perf_counter()
    with tqdm(total=len(samples), initial=len(samples) - len(todo), desc=f"eval {split}", unit="sample",
              disable=not progress) as bar:
        for count, (sample, outcome) in enumerate(runner.outcomes(todo), start=1):
            record = score_sample(sample, outcome).to_record()
            log.append(record)
            finished[sample.id] = record
            now = time.perf_counter()
            rate = 60 * count / max(now - started, 1e-9)
            bar.update(1)
            bar.set_postfix(per_min=f"{rate:.1f}")
            if not progress and now - last_log >= PROGRESS_LOG_EVERY_S:
                logger.info("split %s: %d/%d samples done (%.1f samples/min)", split, len(samples) - len(todo) + count, len(samples),
                            rate)
                last_log = now
    elapsed = time.perf_counter() - started
    if todo:
        logger.info("split %s: ran %d samples in %.1f s (%.1f samples/min)", split, len(todo), elapsed,
                    60 * len(todo) / max(elapsed, 1e-9))
    results = [SampleResult.from_record(finished[sample.id]) for sample in samples]
    summary = {**summarize(split, results), "quarantined_rows": list(quarantined)}
    path = write_split_results(Path(results_dir) / f"{split}.json", split, summary, results)
    return SplitRun(split, summary, path, len(todo))
