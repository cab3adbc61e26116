"""Why does the SFT model not crop? Its first tokens after the think prefix, measured (#46 item 1).

The greedy SFT model of world version 2 made 0.00 crop calls per validation question, though
every first-wording agentic event row of its SFT data crops (`docs/miniature.md`). Where the
decision is lost cannot be read off greedy outputs: it is a next-token distribution. This
probe puts each held-out question of an evaluation split to the model exactly as the agentic
evaluation does (`eval.prompting.episode_prompt`, the overview at K frames as timestamped
images, the generation prompt ending in the think prefix: `agent.rollout.prepare_prompt`), then

- reads the next-token distribution at the first position after `<think>\\n` (top 5);
- teacher-forces each opening the cold-start teacher writes (`teacher_openings`, prefixes of the
  first think of `data.synth.traces`: two that go on to crop, two that do not) after the
  prompt, and keeps the log-probability of every token along it. The probability of a whole
  opening, relative to the others, is what the model prefers at the branch: `crop_share` is
  the crop openings' share of the four openings' probability; `mass` is how much of the whole
  distribution the four hold (low: the model writes something else);
- decodes 24 tokens greedily with the evaluation's engine and names the opening the
  continuation follows (its longest common token prefix with one, at least 3 tokens), else
  `other`.

Rows are grouped by the question's wording (`measurements.wording_of`) and K. Every figure is a
mean over questions; `summarize` and `render_tables` are pure.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.config import PipelineConfig
from paravt_core.eval.prepared import load_split_file
from paravt_core.eval.prompting import episode_prompt, is_agentic, prompt_mode_for, rollout_config
from paravt_core.miniature.measurements import wording_of
from paravt_core.model.loading import build_model, load_processor

# lazy: torch (2.3 s to import) only where a model runs: `paravt miniature` imports this module to
# check a command's config, model folder and split first (a config error took 0.9 s; 6.9 s with
# these imports at the top).

# Prefixes of the teacher's first thinks (data/synth/traces.py; tests/unit/test_opening_probe.py
# holds them to the traces): each up to where the teacher's text would start to vary by row.
# The crop openings by `data.synth.crop_opening` (`traces.CROP_OPENING_TEXTS`).
NO_CROP_OPENINGS = {
    "no crop: enough": "The overview frames should be enough to answer this. No crop is needed.",
    "no crop: background": "The question is about the background, which every overview frame shows",
}
CROP_OPENINGS_BY_STYLE = {
    "shared": {"crop: depends": "The answer depends on a short event, which can fall between the overview frames. "
                                "I will crop",
               "crop: easy to miss": "Short events are easy to miss in the overview frames, so let me crop"},
    "own_token": {"crop: can fall": "Short events can fall between the overview frames. I will crop",
                  "crop: easy to miss": "Short events are easy to miss in the overview frames, so let me crop"},
}


# The skip plan of the overview-reading teacher (`data.synth.teacher_budgets`, `traces.seen_trace`):
# it names what the K frames show, so only its first words are the same for every row.
SEEN_OPENING = {"no crop: seen": "The overview frames show that"}


def teacher_openings(crop_opening: str = "shared", reads_overview: bool = False) -> dict[str, str]:
    """The four openings of the teacher whose tool traces open as `crop_opening` says;
    `reads_overview`: the overview-reading teacher's, whose skip plan says what the frames show."""
    no_crop = dict(NO_CROP_OPENINGS)
    if reads_overview:
        del no_crop["no crop: enough"]
        no_crop = {**SEEN_OPENING, **no_crop}
    return {**CROP_OPENINGS_BY_STYLE[crop_opening], **no_crop}


def config_openings(cfg: PipelineConfig) -> dict[str, str]:
    """The openings of the teacher `cfg`'s world was written by."""
    synth = cfg.data.synth
    return teacher_openings(synth.crop_opening, reads_overview=synth.teacher_budgets is not None)


def skip_opening(cfg: PipelineConfig) -> str:
    """The name of the skip plan of `cfg`'s teacher among `config_openings`."""
    return "no crop: seen" if cfg.data.synth.teacher_budgets is not None else "no crop: enough"


def is_crop(name: str) -> bool:
    return name.startswith("crop:")


OPENINGS = teacher_openings("shared")
CROP_OPENINGS = tuple(name for name in OPENINGS if is_crop(name))
OTHER = "other"
GREEDY_TOKENS = 24
MIN_FOLLOWED = 3  # tokens of common prefix for a greedy continuation to count as following an opening
TOP_K = 5
ALONG = 8  # tokens along each opening shown in the table


@dataclass(frozen=True)
class OpeningRecord:
    """One question at one K: the next-token top 5 after the think prefix, the log-probability
    of each token along each opening, and the opening the greedy continuation follows."""

    sample_id: str
    group: str
    nframes: int
    first_tokens: tuple[tuple[str, float], ...]
    along: dict[str, tuple[float, ...]]  # opening -> log-prob of each of its tokens in context
    greedy: str  # an OPENINGS name or OTHER
    greedy_text: str
    greedy_token_ids: tuple[int, ...] = ()
    greedy_logprobs: tuple[float, ...] = ()  # as the evaluation's engine recorded them

    def opening_logprob(self, name: str) -> float:
        return sum(self.along[name])


@dataclass(frozen=True)
class GroupSummary:
    questions: int
    crop_share: float  # mean over questions of P(crop openings) / P(all openings)
    mass: float  # mean over questions of P(all openings)
    first_token: dict[str, float]  # mean probability of each opening's first token
    along: dict[str, tuple[float, ...]]  # opening -> mean probability of each of its first ALONG tokens
    greedy: dict[str, int]  # opening followed greedily -> questions


def followed_opening(generated: Sequence[int], openings: dict[str, Sequence[int]]) -> str:
    """The opening whose tokens `generated` follows longest (at least MIN_FOLLOWED, or all of
    a shorter opening), else OTHER."""
    best, best_len = OTHER, 0
    for name, ids in openings.items():
        common = 0
        for a, b in zip(generated, ids):
            if a != b:
                break
            common += 1
        if common >= min(MIN_FOLLOWED, len(ids)) and common > best_len:
            best, best_len = name, common
    return best


def crop_share(record: OpeningRecord) -> tuple[float, float]:
    """(share of the crop openings in the openings' probability, the openings' total probability)."""
    logps = {name: record.opening_logprob(name) for name in record.along}
    top = max(logps.values())
    weights = {name: math.exp(lp - top) for name, lp in logps.items()}  # stable at any length
    share = sum(w for name, w in weights.items() if is_crop(name)) / sum(weights.values())
    return share, sum(math.exp(lp) for lp in logps.values())


def summarize(records: Sequence[OpeningRecord]) -> dict[tuple[int, str], GroupSummary]:
    """One summary per (K, wording group), and per K over all groups ("all")."""
    if not records:
        raise ValueError("no probe records to summarize")
    keys: dict[tuple[int, str], list[OpeningRecord]] = {}
    for r in records:
        keys.setdefault((r.nframes, r.group), []).append(r)
        keys.setdefault((r.nframes, "all"), []).append(r)
    out = {}
    for key in sorted(keys, key=lambda k: (k[0], k[1] != "all", k[1])):
        rows = keys[key]
        shares = [crop_share(r) for r in rows]
        names = list(rows[0].along)
        out[key] = GroupSummary(
            questions=len(rows),
            crop_share=statistics.fmean(s for s, _ in shares),
            mass=statistics.fmean(m for _, m in shares),
            first_token={name: statistics.fmean(math.exp(r.along[name][0]) for r in rows) for name in names},
            along={name: tuple(statistics.fmean(math.exp(r.along[name][i]) for r in rows)
                               for i in range(min(ALONG, len(rows[0].along[name])))) for name in names},
            greedy=dict(Counter(r.greedy for r in rows)),
        )
    return out


def render_tables(summaries: dict[tuple[int, str], GroupSummary]) -> str:
    """Two markdown tables: the branch per (K, group); then each opening token by token."""
    names = list(next(iter(summaries.values())).along) if summaries else list(OPENINGS)
    lines = ["| K | questions | group | crop share | openings' mass | "
             + " | ".join(f"P(first token of {n})" for n in names) + " | greedy follows |",
             "|---|---|---|---|---|" + "---|" * len(names) + "---|"]
    for (k, group), s in summaries.items():
        greedy = ", ".join(f"{n} {c}" for n, c in sorted(s.greedy.items(), key=lambda item: -item[1]))
        lines.append(f"| {k} | {s.questions} | {group} | {s.crop_share:.3f} | {s.mass:.2e} | "
                     + " | ".join(f"{s.first_token[n]:.3f}" for n in names) + f" | {greedy} |")
    lines += ["", f"Mean probability of each of the first {ALONG} tokens along each opening (all questions):", "",
              "| K | opening | " + " | ".join(f"t{i + 1}" for i in range(ALONG)) + " |",
              "|---|---|" + "---|" * ALONG]
    for (k, group), s in summaries.items():
        if group != "all":
            continue
        for name in names:
            values = list(s.along[name])
            cells = [f"{v:.3f}" for v in values] + [""] * (ALONG - len(values))
            lines.append(f"| {k} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def forced_logprobs(model, engine, request, openings: Sequence[Sequence[int]]) -> tuple[list[tuple[float, ...]], Any]:
    """Teacher-force each of `openings` after `request`, all in one left-padded forward (the
    prompt's frames go through the vision tower once: `model.vision_dedupe`): the log-probability
    of each forced token in context, per opening, and the next-token log-probabilities at the
    first forced position [V] (the same context for every opening)."""
    import torch

    from paravt_core.agent.engine import GenerationRequest
    from paravt_core.agent.hf_engine import pad_requests

    rows = [GenerationRequest(list(request.prompt_ids) + list(ids), request.vision) for ids in openings]
    batch = pad_requests(rows, engine.pad_id, engine.image_token_id, engine.video_token_id)
    with torch.no_grad():
        logits = model(**batch.model_inputs(model.device)).logits.float()  # [B, L, V]
    length = batch.input_ids.shape[1]
    along, first = [], None
    for row, ids in enumerate(openings):
        start = length - len(ids) - 1  # left padding: the logits that predict the row's first forced token
        logp = torch.log_softmax(logits[row, start:start + len(ids)], dim=-1)  # [n, V]
        along.append(tuple(logp[torch.arange(len(ids)), torch.tensor(list(ids))].tolist()))
        first = logp[0] if first is None else first
    return along, first


def evaluation_requests(processor, cfg: PipelineConfig, samples: Sequence, k: int, stack) -> tuple[list, object]:
    """The first main-agent generation request of each sample at K overview frames, as the
    agentic evaluation builds it (`eval.prompting.episode_prompt`, `agent.rollout.prepare_prompt`,
    then the think prefix as `rollout._Rollout.start` appends it), and the renderer."""
    from paravt_core.agent.context import ChatRenderer, TokenContext
    from paravt_core.agent.engine import GenerationRequest
    from paravt_core.agent.rollout import prepare_prompt

    requests, renderer = [], None
    for index, sample in enumerate(samples):
        mode = prompt_mode_for(sample, cfg.eval)
        if not is_agentic(mode):
            raise ValueError(f"{sample.id}: prompt mode {mode!r} is not agentic; the probe reads the "
                             "agentic prompt (eval.prompt_mode)")
        rollout_cfg = rollout_config(cfg.eval, mode, cfg.rl.rollout)
        renderer = ChatRenderer(processor, rollout_cfg.think_prefix, (cfg.video.min_pixels, cfg.video.max_pixels))
        prepared = prepare_prompt(index, episode_prompt(sample, mode, cfg.eval.dispatch, k), renderer, cfg.video, stack)
        context = TokenContext.from_prompt(prepared.encoded)
        if renderer.generation_prefix:
            context.append_forced(renderer.encode(renderer.generation_prefix), renderer.generation_prefix)
        requests.append(GenerationRequest(list(context.token_ids), context.vision))
    return requests, renderer


def probe_split(model_dir: Path, cfg: PipelineConfig, split_json: Path, frame_counts: Sequence[int],
                rows: int, openings: dict[str, str] | None = None, log_line=print) -> list[OpeningRecord]:
    """Probe the first `rows` questions of the prepared split `split_json` at each K (module
    docstring); `openings` defaults to the config's teacher's (`teacher_openings`)."""
    import time
    from contextlib import ExitStack

    import torch

    from paravt_core.agent.engine import SamplingParams

    openings = dict(config_openings(cfg) if openings is None else openings)
    samples = load_split_file(split_json)[:rows]
    if not samples:
        raise ValueError(f"{split_json}: the split has no questions")
    processor = load_processor(model_dir)
    model = build_model(cfg.model, model_dir, dtype="float32").eval()
    engine = build_hf_engine(cfg, model, processor, "evaluation")  # as the evaluation
    tokenizer = processor.tokenizer
    records: list[OpeningRecord] = []
    for k in frame_counts:
        started = time.perf_counter()
        with ExitStack() as stack:
            requests, renderer = evaluation_requests(processor, cfg, samples, k, stack)
            opening_ids = {name: renderer.encode(text).token_ids for name, text in openings.items()}
            greedy = engine.generate(requests, SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0,
                                                              stop_token_ids=(renderer.turn_end_id,)))
            for sample, request, generation in zip(samples, requests, greedy):
                forced, next_token = forced_logprobs(model, engine, request, list(opening_ids.values()))
                along = dict(zip(opening_ids, forced))
                top = torch.topk(next_token.exp(), TOP_K)
                first = tuple((_token_text(tokenizer, int(i)), float(p))
                              for p, i in zip(top.values.tolist(), top.indices.tolist()))
                group = ("second" if wording_of(_question_line(sample.question)) else "first") + " wording"
                records.append(OpeningRecord(sample.id, group, k, first, along,
                                             followed_opening(generation.token_ids, opening_ids),
                                             tokenizer.decode(generation.token_ids), tuple(generation.token_ids),
                                             tuple(generation.logprobs)))
        seconds = time.perf_counter() - started
        log_line(f"opening probe: K={k}, {len(samples)} questions in {seconds:.0f} s "
                 f"({len(samples) / max(seconds, 1e-9):.2f} questions/s)")
    return records


def _question_line(question: str) -> str:
    """The question sentence of an evaluation question: its first line (options and the
    instruction follow on later lines, `eval.samples`), without SPEC §7's "Question: "."""
    return question.split("\n", 1)[0].strip().removeprefix("Question: ")
