"""Does a checkpoint speak the response grammar? (the SFT stage's acceptance check, SPEC §2-§3)

Held-out prompts (eval-split questions on videos no training row uses, put with the
training rows' system prompt) are rolled out greedily with the agentic protocol. An
episode follows the grammar when every main-agent turn closes its `<think>`, every tool
call block parses and asks for a window inside the video, and the episode ends with an
`<answer>...</answer>` turn (think -> tool calls -> ... -> answer, or think -> answer).

The check loads each model on a GPU where there is one, so it runs in a process of its own
(`run_in_own_process`, `paravt_core/own_process.py`) and that memory is returned when it ends:
in the flow process PyTorch's caching allocator would keep it for the whole run, beside RL
rank 0 on the same card (`paravt_core/device_ledger.py`).
"""

from __future__ import annotations

import json

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import BaseModel

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.agent.prompts import EpisodePrompt
from paravt_core.agent.rollout import Episode, run_dropping_undecodable, run_episodes
from paravt_core.config import EVAL_SPLITS, PipelineConfig
from paravt_core.dist.ds_config import training_dtype
from paravt_core.eval.prepared import load_split_file
from paravt_core.model.loading import build_model, load_processor
from paravt_core.own_process import call_in_own_process
from paravt_core.plan import declare_stage
from paravt_core.sft.dataset import read_sft_rows

ANSWER = re.compile(r"<answer>\s*\S.*?</answer>", re.S)


class NoHeldOutPrompts(ValueError):
    """No prepared benchmark split has a sample with its video, so there is nothing to check."""


@dataclass(frozen=True)
class GrammarReport:
    episodes: int
    follows_grammar: int
    used_tools: int
    mean_tool_calls: float
    set_aside: tuple[tuple[str, str], ...] = ()  # (prompt id, why) of prompts whose video did not decode

    @property
    def rate(self) -> float:
        return self.follows_grammar / self.episodes if self.episodes else 0.0


def follows_grammar(episode: Episode) -> bool:
    generated = [seg.text for seg in episode.transcript if seg.generated]
    if not generated or episode.end_reason != "answer":
        return False
    if episode.parse_failures or episode.rejected_calls or episode.unanswered_calls:
        return False
    if not all("</think>" in turn for turn in generated):
        return False
    return bool(ANSWER.search(generated[-1]))


def held_out_prompts(sft_rows: Sequence[dict], samples: Sequence) -> list[EpisodePrompt]:
    """Eval-split samples asked the way the training rows ask: with the system prompt of the
    first row that calls a tool (sub-agent rows have none, and rows asked in the evaluation's
    direct mode carry a system prompt without tools), else of the first row that has one."""
    def system_of(row: dict) -> dict | None:
        return next((m for m in row["messages"] if m["role"] == "system"), None)

    def calls_a_tool(row: dict) -> bool:
        return any(m["role"] == "assistant" and "<tool_call>" in json.dumps(m["content"]) for m in row["messages"])

    with_system = [row for row in sft_rows if system_of(row)]
    chosen = next((row for row in with_system if calls_a_tool(row)), with_system[0] if with_system else None)
    system = system_of(chosen) if chosen else None
    prompts = []
    for sample in samples:
        text = f"{sample.question}\nThe video path for this video is: {Path(sample.video_path).name}"
        messages = ([{"role": "system", "content": system["content"]}] if system else []) + [
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}
        ]
        prompts.append(EpisodePrompt(sample.id, Path(sample.video_path), tuple(messages), tools=()))
    return prompts


def in_batches(prompts: Sequence[EpisodePrompt], size: int | None, run: Callable[[list], list]) -> list:
    """`run` over `prompts` `size` at a time (all at once when None), results in prompt order.

    One `generate` over all 56 prompts does not fit one GPU at 8B (`sft.grammar_batch`)."""
    size = size or max(1, len(prompts))
    return [episode for start in range(0, len(prompts), size) for episode in run(list(prompts[start:start + size]))]


def grammar_report(model_dir: Path, prompts: Sequence[EpisodePrompt], cfg: PipelineConfig,
                   undecodable: set[str] | None = None) -> GrammarReport:
    """Greedy episodes of `model_dir` on `prompts`; a prompt whose video does not decode is set
    aside (named in the report) as evaluation and RL do, and `undecodable` is extended."""
    import logging

    import torch

    undecodable = set() if undecodable is None else undecodable
    on_gpu = torch.cuda.is_available()
    processor = load_processor(model_dir)
    model = build_model(cfg.model, model_dir, dtype=training_dtype(cfg.model.dtype, on_gpu),
                        device="cuda" if on_gpu else "cpu")
    engine = build_hf_engine(cfg, model.eval(), processor, "evaluation")
    kept, episodes = run_dropping_undecodable(
        prompts, lambda kept: in_batches(kept, cfg.sft.grammar_batch, lambda batch: run_episodes(
            engine, processor, batch, cfg.rl.rollout, cfg.video, group_size=1, temperature=0.0)),
        lambda p: p.video_path, undecodable, logging.getLogger(__name__).warning, who="SFT grammar check")
    kept_ids = {p.prompt_id for p in kept}
    return GrammarReport(
        episodes=len(episodes),
        follows_grammar=sum(follows_grammar(e) for e in episodes),
        used_tools=sum(e.tool_calls > 0 for e in episodes),
        mean_tool_calls=sum(e.tool_calls for e in episodes) / max(1, len(episodes)),
        set_aside=tuple((p.prompt_id, f"cannot read video {p.video_path}: it does not decode (sample left out of "
                         "the grammar check)") for p in prompts if p.prompt_id not in kept_ids),
    )


PER_SPLIT = 8  # held-out prompts per eval split (the memory plan counts them: paravt_core/plan.py)


def held_out_samples(eval_dir: Path, per_split: int = PER_SPLIT) -> list:
    """The first `per_split` samples with a video of each prepared eval split.

    Raises:
        NoHeldOutPrompts: there is none (said before any model loads).
    """
    samples = []
    for split in EVAL_SPLITS:
        split_json = Path(eval_dir) / split / "split.json"
        if split_json.is_file():
            samples += [s for s in load_split_file(split_json) if not s.video_missing][:per_split]
    if not samples:
        # Before any model loads, and not as a decoding failure: there was nothing to decode.
        prepared = sorted(p.parent.name for p in Path(eval_dir).glob("*/split.json"))
        raise NoHeldOutPrompts(f"SFT grammar check: no held-out prompt: no benchmark split prepared under {eval_dir} "
                               f"(found: {prepared or 'none'}) has a sample whose video is there; eval.splits must "
                               f"name at least one of {list(EVAL_SPLITS)} and the data stage must fetch its videos")
    return samples


def run(cfg: PipelineConfig, base_dir: Path, sft_dir: Path, sft_rows_dir: Path, eval_dir: Path,
        per_split: int = PER_SPLIT) -> dict[str, GrammarReport]:
    """Grammar of the base and SFT checkpoints on held-out eval-split questions, in this process.

    The first `per_split` samples of each of the seven splits with a video: 56 prompts on the
    embedded default, enough that one episode moves the rate by under 2 points.
    """
    # One claim for the process: the base and the SFT model are loaded one after the other, and the
    # plan's row is the larger of the two (the same shape), not their sum.
    declare_stage("SFT grammar check", "SFT grammar check", cfg, base_dir)
    samples = held_out_samples(eval_dir, per_split)
    rows = read_sft_rows(sorted(Path(sft_rows_dir).glob("*.parquet")))
    prompts = held_out_prompts(rows, samples)
    undecodable: set[str] = set()  # a video that fails for the base model is skipped for the SFT one
    base = grammar_report(base_dir, prompts, cfg, undecodable)
    return {"base": base, "sft": grammar_report(sft_dir, prompts, cfg, undecodable)}


class GrammarJob(BaseModel):
    """`run`'s arguments, as `run_job` gets them in the check's own process."""

    config: PipelineConfig
    base_dir: Path
    sft_dir: Path
    sft_rows_dir: Path
    eval_dir: Path
    per_split: int = PER_SPLIT


def reports_to_json(reports: dict[str, GrammarReport]) -> str:
    return json.dumps({name: asdict(report) for name, report in reports.items()}, indent=1)


def reports_from_json(text: str) -> dict[str, GrammarReport]:
    return {name: GrammarReport(**{**fields, "set_aside": tuple(tuple(entry) for entry in fields["set_aside"])})
            for name, fields in json.loads(text).items()}


def run_job(job: str) -> str:
    """`run` of a `GrammarJob` (JSON), its reports as JSON: the check's own process calls it."""
    spec = GrammarJob.model_validate_json(job)
    return reports_to_json(run(spec.config, spec.base_dir, spec.sft_dir, spec.sft_rows_dir, spec.eval_dir,
                               spec.per_split))


def run_in_own_process(cfg: PipelineConfig, base_dir: Path, sft_dir: Path, sft_rows_dir: Path, eval_dir: Path,
                       work_dir: Path, log_line: Callable[[str], None] = print,
                       per_split: int = PER_SPLIT) -> dict[str, GrammarReport]:
    """`run` in a process of its own (module docstring), its job and reports kept in `work_dir`;
    its output lines go to `log_line`. Missing held-out samples are said here, before any launch.

    Raises:
        RuntimeError: the check's process failed (the message holds its last lines).
    """
    held_out_samples(eval_dir, per_split)
    job = GrammarJob(config=cfg, base_dir=Path(base_dir).resolve(), sft_dir=Path(sft_dir).resolve(),
                     sft_rows_dir=Path(sft_rows_dir).resolve(), eval_dir=Path(eval_dir).resolve(), per_split=per_split)
    return reports_from_json(call_in_own_process("paravt_core.sft.grammar:run_job", job.model_dump_json(), work_dir,
                                                 log_line))
