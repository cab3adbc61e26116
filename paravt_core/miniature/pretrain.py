"""Perception pretraining of the tiny base model (#15): it arrives able to see, as Qwen3-VL does.

The real Qwen3-VL-8B comes to cold-start SFT already able to say what a clip shows; a
random-weight tiny Qwen3-VL does not, and SFT at batch 1 never taught it (the sub-agent
named 2 of 32 held-out event colours, chance; docs/miniature.md). Measured
on clips of the reproduce world: at micro-batch 8 and lr 1e-3 the tiny model names most
held-out event colours within several hundred steps. So, for `model.base: tiny` with
`model.pretrain.enabled`, the base model stage is followed by this one, which makes the
tiny kit more like the real base model, not friendlier to the method:

- the corpus is a generated world of its own (the data config's geometry and event kinds,
  but a separate seed stream, so no pretraining video is a training or evaluation video):
  `windows_per_video` clips per video (its grid segments, then random 4-16 s windows);
- a clip is shown exactly as a sub-agent's crop is (a video item with `video_start` /
  `video_end`, sampled by the SFT encoder as `agent.dispatch` samples crops: same frames,
  same timestamped image items, same pixel bounds), asked with a plain captioning request
  (`CAPTION_REQUEST`), NOT the sub-agent prompt of SPEC §3: learning to answer that prompt,
  and the main agent's protocol, is still cold-start SFT's job;
- the caption is the world's ground truth of the window, in the summary wording of
  `data.synth.traces.summarize_window`, an empty window's with its background tint named
  (`background=True`: most of the colour signal this phase gets, measured);
- with `reading_rows`, a second phase (folder `pretrain-reading/`) trains on text-only
  reading rows (`reading_row`), with the clips replayed beside them: the notes a
  video's grid segments would get from sub-agents, a question on one event asked as the
  evaluation asks it, and an answer that quotes the relevant note and names the option. The
  real Qwen3 language model reads a context and picks the option it supports; the tiny
  random-weight one does not, and cold-start SFT at batch 1 never taught it (held-out
  answers at chance while the sub-agent's reports were right;
  docs/miniature.md). No tool protocol, no system prompt: SFT still teaches those;
- with `reading_transcripts`, that share of the reading rows is laid out as an agent's
  transcript, text only (`transcript_row`: question, crop calls, the notes as the tool's
  replies, the final turn), so the options stand as far back as in the agent's own
  transcript; still no system prompt;
- training is the SFT trainer (`paravt_core.sft.stage` under the folder `pretrain/`,
  DeepSpeed, checkpoints and exact resume) with `model.pretrain`'s steps, micro-batch and
  learning rate in place of the `sft` section's;
- a finished pretraining is filed by the content it trained on, not by the world's folder or
  code (`pretrain_cache`): a world whose corpus is the same clips, captions and reading rows
  reuses it instead of training again (#45 item 4).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from pathlib import Path

from paravt_core.atomic import atomic_dir
from paravt_core.config import PipelineConfig
from paravt_core.data.synth.world import VideoSpec
from paravt_core.dist.launch import LogLine
from paravt_core.refs import ArtifactRef, content_hash
from paravt_core.sft.stage import ExtraShard

CAPTION_REQUEST = "Describe what happens in these frames."
OVERVIEW_REQUEST = "Describe what these overview frames of the whole video show."
CORPUS_FILE = "captions.parquet"
READING_FILE = "reading.parquet"
READING_NOTES = "Notes on a video:"


# The world settings a clip's pixels and caption depend on; trace and question settings
# (sft_traces_per_video, prompts, ...) do not change the corpus, so they must not rebuild it.
WORLD_FIELDS = ("seed", "min_duration_s", "max_duration_s", "fps", "width", "height", "min_events", "max_events",
                "min_event_s", "max_event_s", "overview_blind_frames", "event_kinds", "max_crop_s", "codec", "colours",
                "overview_blind_budgets", "visible_event_share", "visible_event_min_s", "visible_event_max_s")
# The question settings of `questions.OptionStyle.of`, which draws the reading rows' questions.
STYLE_FIELDS = ("question_topics", "option_order", "colours", "second_wording")
# The trace settings a transcript reading row (`transcript_row`) depends on.
TRANSCRIPT_FIELDS = {"max_calls_per_trace", "max_crop_s", "teacher_windows", "final_reasoning", "prompts"}
READING_FIELDS = ("reading_rows", "reading_steps", "reading_transcripts", "sft_replay_rows")


def corpus_dir(cfg: PipelineConfig) -> Path:
    """`<output_dir>/pretrain/corpus-<hash>`: a pure function of `model.pretrain`, the world's
    geometry and events (`WORLD_FIELDS`) and the code that draws them."""
    from paravt_core.refs import source_digest

    pre = cfg.model.pretrain
    settings = {"pretrain": pre.model_dump(mode="json", exclude={*READING_FIELDS, "overview_rows"}),
                "world": cfg.data.synth.model_dump(mode="json", include=set(WORLD_FIELDS))}
    if pre.overview_rows:  # named only when set, so corpora without them keep their folders
        settings["overview"] = {"rows": pre.overview_rows, "budgets": list(overview_budgets(cfg))}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    builder = source_digest("paravt_core.data.synth")
    return cfg.run.output_dir / "pretrain" / f"corpus-{key}-{builder}"


def clip_windows(
    rng: random.Random, spec: VideoSpec, segment_s: int, count: int, event_share: float = 0.0
) -> list[tuple[int, int]]:
    """`count` whole-second windows of a video: its `segment_s` grid first, then random 4 s to
    `segment_s` windows (distinct), each drawn with probability `event_share` to hold one of
    the video's events whole, else anywhere."""
    import math

    from paravt_core.data.synth.traces import segment_grid

    last = int(spec.duration_s)
    windows = segment_grid(spec, segment_s)[:count]
    for _ in range(20 * count):
        if len(windows) >= count:
            break
        length = rng.randint(min(4, last), min(segment_s, last))
        if event_share and spec.events and rng.random() < event_share:
            event = rng.choice(spec.events)
            lo, hi = max(0, math.ceil(event.end_s) - length), min(math.floor(event.start_s), last - length)
            if lo > hi:  # the event is longer than the window: draw again
                continue
            start = rng.randint(lo, hi)
        else:
            start = rng.randint(0, last - length)
        if (start, start + length) not in windows:
            windows.append((start, start + length))
    return windows


def overview_budgets(cfg: PipelineConfig) -> tuple[int, ...]:
    """The budgets K the overview rows draw from: the teacher's (`data.synth.teacher_budgets`), else
    SFT's (`video.sft_frame_choices`), else the one SFT budget (`video.sft_max_frames`)."""
    return tuple(cfg.data.synth.teacher_budgets or cfg.video.sft_frame_choices or (cfg.video.sft_max_frames,))


def overview_caption(spec: VideoSpec, k: int) -> str:
    """What the video's K overview frames (the pipeline's own sampler) show, in the words of the
    overview-reading teacher (`data.synth.traces.seen_trace`): the events on them, else the
    plain background with its tint named (as an empty clip's caption names it)."""
    from paravt_core.data.synth.traces import SEEN_OPENING, background_phrase, event_clause
    from paravt_core.data.synth.world import event_on_overview

    shown = [e for e in spec.events if event_on_overview(spec, e, k)]
    if not shown:
        return f"The overview frames show only the plain {background_phrase(spec)} background."
    return f"{SEEN_OPENING} " + " and ".join(event_clause(e) for e in shown) + "."


def overview_row(video_file: Path, k: int, caption: str) -> dict:
    """An SFT row: the whole video's K overview frames (`nframes`, sampled as SFT samples an
    overview), the overview request, the caption."""
    video = {"type": "video_url", "video_url": {"url": video_file.resolve().as_uri()}, "nframes": k}
    return {"messages": [{"role": "user", "content": [video, {"type": "text", "text": OVERVIEW_REQUEST}]},
                         {"role": "assistant", "content": [{"type": "text", "text": caption}]}],
            "videos": [video_file.resolve().as_uri()]}


def caption_row(video_file: Path, window: tuple[int, int], caption: str) -> dict:
    """An SFT row: the window's frames (sampled as a crop), the caption request, the caption."""
    start, end = window
    clip = {"type": "video_url", "video_url": {"url": video_file.resolve().as_uri()},
            "video_start": float(start), "video_end": float(end)}
    return {"messages": [{"role": "user", "content": [clip, {"type": "text", "text": CAPTION_REQUEST}]},
                         {"role": "assistant", "content": [{"type": "text", "text": caption}]}],
            "videos": [video_file.resolve().as_uri()]}


def mcq_event_question(rng: random.Random, spec: VideoSpec, topics: tuple[str, ...] | None, style=None):
    """A 4-option multiple-choice question on a random (event, topic) pair of `spec` whose
    topic is among `topics` (all when None) and allows multiple choice; options drawn as
    `style` (a `data.synth.questions.OptionStyle`; None: shuffled from every colour).

    `data.synth.questions.random_event_question` draws the type too; this lives here, not
    there, because an edit to the synth package renames the captioning corpus (`corpus_dir`).

    Raises:
        ValueError: no event of the video supports a multiple-choice question on `topics`.
    """
    from paravt_core.data.synth.questions import EVENT_TOPICS, SHUFFLED, TOPIC_TYPES, event_question

    pairs = [(i, t) for i, e in enumerate(spec.events) for t in EVENT_TOPICS[e.kind]
             if (topics is None or t in topics) and "mcq" in TOPIC_TYPES[t]]
    if not pairs:
        raise ValueError(f"video {spec.video_id}: no event supports a multiple-choice question on {list(topics or ())}")
    index, topic = rng.choice(pairs)
    return event_question(rng, spec, index, "mcq", 4, topic=topic, style=style or SHUFFLED)


def reading_row(
    rng: random.Random, spec: VideoSpec, segment_s: int, topics: tuple[str, ...] | None, style=None
) -> dict:
    """A text-only row: the video's notes (one line per `segment_s` grid segment, in the
    sub-agent summary wording), a multiple-choice question on one event in the evaluation's layout (SPEC §7),
    and the answer: the note(s) of the segment(s) holding the event, then the conclusion the
    teacher traces end with (`data.synth.traces.conclusion`)."""
    from paravt_core.data.synth.traces import clock, conclusion, segment_grid, summarize_window
    from paravt_core.data.synth.world import events_in_window
    from paravt_core.eval.samples import mcq_question

    # Multiple-choice only: the value is also taught by the quote, but reading the options to
    # the letter is what the tiny model learns slowest. Measured (`paravt miniature reading-probe`): with
    # colour questions, half of them open-ended, 3000 steps left every check wrong (chains 0 %,
    # verdicts by position); colour and corner questions (by their draw, about three
    # multiple-choice rows in four) got 80.5 %, multiple-choice only 91.5 %.
    question = mcq_event_question(rng, spec, topics, style)
    grid = segment_grid(spec, segment_s)
    notes = "\n".join(f"{clock(s)} to {clock(e)}: {summarize_window(spec, s, e)}" for s, e in grid)
    event = spec.events[question.event_index]
    quoted = " ".join(summarize_window(spec, s, e) for s, e in grid if event in events_in_window(spec, s, e))
    asked = mcq_question(question.text, question.options)
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": f"{READING_NOTES}\n{notes}\n\n{asked}"}]},
                         {"role": "assistant", "content": [
                             {"type": "text", "text": f"The notes say: {quoted} {conclusion(question, spec)}"}]}],
            "videos": []}


def transcript_row(rng: random.Random, spec: VideoSpec, synth, topics: tuple[str, ...] | None) -> dict:
    """A reading row laid out as a main agent's transcript, text only: the evaluation's question
    on one event (multiple choice), the teacher's first turn (`data.synth.traces.tool_trace`,
    the SFT rows' plan and crop calls), the notes of the crops as the tool's replies, and the
    teacher's final turn. No system prompt and no frames: the frames come before the question,
    so the options stand as far from the final turn as in an SFT row (`paravt miniature agent-probe`'s
    distance), and the protocol is still SFT's to teach.

    Measured: the reading phase on `reading_row`s alone copied the options into the checking
    lines on 91.5 % of held-out reading rows (options ~110 tokens back), the SFT model in 21.9 %
    of held-out transcripts (~520 back), where it copied the value instead. With half the
    reading rows laid out this way (3000 steps), 29.7 % of held-out transcripts, and the notes
    rows' chains fell to 6 %: the tiny model copies from a fixed distance back
    (`paravt miniature reading-probe --pad`), and these rows do not teach it to look an option up."""
    from paravt_core.data.synth.paravt import TrainVideo, sft_messages
    from paravt_core.data.synth.questions import OptionStyle
    from paravt_core.data.synth.traces import tool_trace

    question = mcq_event_question(rng, spec, topics, OptionStyle.of(synth))
    video = TrainVideo(spec=spec, sentinel=f"{spec.video_id}.mp4")
    trace = tool_trace(rng, spec, question, video.name, synth.max_calls_per_trace, synth.max_crop_s,
                       cover=synth.teacher_windows == "cover", final_reasoning=synth.final_reasoning)
    messages = sft_messages(trace, video, synth.prompts)
    user, *turns = [m for m in messages if m["role"] != "system"]
    text_only = {"role": "user", "content": [c for c in user["content"] if c["type"] == "text"]}
    return {"messages": [text_only, *turns], "videos": []}


def build_corpus(cfg: PipelineConfig, log_line: LogLine = print) -> ArtifactRef:
    """Write the captioning corpus (videos + one parquet of rows) once; return its reference."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.data.synth.render import encode_mp4
    from paravt_core.data.synth.traces import summarize_window
    from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id

    out = corpus_dir(cfg)
    if not (out / CORPUS_FILE).is_file():
        pre, synth = cfg.model.pretrain, cfg.data.synth
        with atomic_dir(out) as tmp:
            rows = []
            for index in range(pre.videos):
                rng = derived_rng(synth.seed, "pretrain", pre.seed, index)
                spec = sample_video(rng, synth, youtube_like_id(rng))
                video_file = tmp / "videos" / f"{spec.video_id}.mp4"
                video_file.parent.mkdir(exist_ok=True)
                video_file.write_bytes(encode_mp4(spec, synth.codec))
                final_file = out / "videos" / video_file.name
                for window in clip_windows(rng, spec, int(synth.max_crop_s), pre.windows_per_video,
                                           pre.event_windows):
                    rows.append(caption_row(final_file, window, summarize_window(spec, *window, background=True)))
                for k in overview_row_budgets(rng, cfg, spec):
                    rows.append(overview_row(final_file, k, overview_caption(spec, k)))
                if (index + 1) % 100 == 0:
                    log_line(f"pretrain corpus: {index + 1}/{pre.videos} videos")
            pq.write_table(_table(rows), tmp / CORPUS_FILE)
        log_line(f"pretrain corpus: {len(rows)} captioned clips of {pre.videos} videos in {out}")
    return ArtifactRef(kind="pretrain_corpus", path=out.resolve(), sha256=content_hash(out / CORPUS_FILE))


def overview_row_budgets(rng: random.Random, cfg: PipelineConfig, spec: VideoSpec) -> list[int]:
    """The budgets of a pretraining video's `model.pretrain.overview_rows` overview rows: each
    drawn from `overview_budgets`, half of them (when the video has an event) among the budgets
    whose frames show it, so seen and unseen overviews are both common (distinct, as many as
    there are budgets)."""
    from paravt_core.data.synth.world import event_on_overview

    count = cfg.model.pretrain.overview_rows
    if not count:
        return []
    budgets = list(overview_budgets(cfg))
    seen = [k for k in budgets if any(event_on_overview(spec, e, k) for e in spec.events)]
    chosen: list[int] = []
    for index in range(min(count, len(budgets))):
        pool = [k for k in (seen if index % 2 == 0 and seen else budgets) if k not in chosen]
        pool = pool or [k for k in budgets if k not in chosen]
        chosen.append(rng.choice(pool))
    return chosen


def reading_dir(cfg: PipelineConfig, clips: ArtifactRef) -> Path:
    """`<output_dir>/pretrain/reading-<hash>`: a pure function of the pretraining seed and
    row count, the clips replayed, the world's geometry, events, question topics, option order and
    question wordings (`OptionStyle.of` draws the rows' questions), and the code that draws them."""
    from paravt_core.refs import source_digest

    pre = cfg.model.pretrain
    settings = {"seed": pre.seed, "rows": pre.reading_rows, "clips": clips.sha256,
                "world": cfg.data.synth.model_dump(mode="json", include={*WORLD_FIELDS, *STYLE_FIELDS})}
    if pre.reading_transcripts:  # their layout follows the trace settings too
        settings["transcripts"] = pre.reading_transcripts
        settings["traces"] = cfg.data.synth.model_dump(mode="json", include=TRANSCRIPT_FIELDS)
    settings["rows_code"] = source_digest("paravt_core.miniature", only=("pretrain.py",))  # reading_row lives here
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return cfg.run.output_dir / "pretrain" / f"reading-{key}-{source_digest('paravt_core.data.synth')}"


def build_reading_corpus(cfg: PipelineConfig, clips: ArtifactRef, log_line: LogLine = print) -> ArtifactRef:
    """Write the reading phase's corpus once: the text-only reading rows (videos drawn from the
    corpus's own stream, never rendered) beside a copy of the captioned clips of `clips`.

    The clips are replayed because reading alone undid perception: after 3000 text-only steps
    and SFT, the sub-agent named 31 % of held-out event colours (`paravt miniature perception`), where the
    same SFT on the perception phase's model names 77-88 %."""
    import shutil

    import pyarrow.parquet as pq

    from paravt_core.data.synth.questions import OptionStyle
    from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id

    out = reading_dir(cfg, clips)
    if not (out / READING_FILE).is_file():
        pre, synth = cfg.model.pretrain, cfg.data.synth
        topics = tuple(synth.question_topics) if synth.question_topics else None
        style = OptionStyle.of(synth)
        rows = []
        for index in range(pre.reading_rows):
            rng = derived_rng(synth.seed, "pretrain-reading", pre.seed, index)
            layout = derived_rng(synth.seed, "pretrain-reading-layout", pre.seed, index).random()
            spec = sample_video(rng, synth, youtube_like_id(rng))
            if layout < pre.reading_transcripts:
                rows.append(transcript_row(rng, spec, synth, topics))
            else:
                rows.append(reading_row(rng, spec, int(synth.max_crop_s), topics, style))
        with atomic_dir(out) as tmp:
            pq.write_table(_table(rows), tmp / READING_FILE)
            shutil.copyfile(Path(clips.path) / CORPUS_FILE, tmp / CORPUS_FILE)
        log_line(f"pretrain reading corpus: {len(rows)} rows and the clips replayed in {out}")
    return ArtifactRef(kind="pretrain_corpus", path=out.resolve(), sha256=content_hash(out))


def replay_shard(cfg: PipelineConfig, out_file: Path, log_line: LogLine = print) -> Path:
    """Write `model.pretrain.sft_replay_rows` rows of the reading phase's corpus (reading rows
    and captioned clips alike, drawn without replacement, seeded by `run.seed`) as one SFT
    shard at `out_file`, once; return it.

    Measured: cold-start SFT on its own rows undid the reading phase (`paravt miniature reading-probe`:
    whole checking chains 80.5 % before, 6-7.5 % after), as fine-tuning a small model on a
    narrow task does; replaying the pretraining rows beside the task's is the usual remedy.
    """
    import io

    import pyarrow.parquet as pq

    from paravt_core.atomic import atomic_write_bytes

    count = cfg.model.pretrain.sft_replay_rows
    if out_file.is_file():
        return out_file
    reading = Path(build_reading_corpus(cfg, build_corpus(cfg, log_line), log_line).path)
    tables = [pq.read_table(reading / name) for name in (READING_FILE, CORPUS_FILE)]
    rows = [row for table in tables for row in table.to_pylist()]
    if count > len(rows):
        raise ValueError(f"model.pretrain.sft_replay_rows={count} > the {len(rows)} rows of the reading phase's "
                         f"corpus {reading}: lower it or raise model.pretrain.reading_rows")
    chosen = random.Random(cfg.run.seed).sample(rows, count)
    buf = io.BytesIO()
    pq.write_table(_table([{"messages": json.loads(r["messages"]), "videos": r["videos"]} for r in chosen]), buf)
    atomic_write_bytes(out_file, buf.getvalue())
    clips = sum(bool(r["videos"]) for r in chosen)
    log_line(f"SFT replay: {count - clips} reading rows and {clips} captioned clips of {reading} in {out_file}")
    return out_file


def sft_replay(cfg: PipelineConfig) -> ExtraShard | None:
    """The replay rows as SFT's extra shard (`sft.stage.run(..., extra=)`), or None when the config
    replays none. The key names the row count; which rows: the base model's hash covers the
    pretraining corpus they come from."""
    count = cfg.model.pretrain.sft_replay_rows if cfg.model.pretrain.enabled else 0
    if not count:
        return None
    return ExtraShard(f"replay={count}", "replay.parquet", functools.partial(replay_shard, cfg))


def _table(rows: list[dict]):
    import pyarrow as pa

    return pa.table({"messages": [json.dumps(r["messages"]) for r in rows],
                     "videos": pa.array([r["videos"] for r in rows], type=pa.list_(pa.string()))})


def training_config(cfg: PipelineConfig, steps: int | None = None,
                    micro_batch_size: int | None = None) -> PipelineConfig:
    """`cfg` with the `sft` section replaced by the pretraining's optimisation settings
    (`steps`, `micro_batch_size`: another phase's in place of the captioning phase's)."""
    pre = cfg.model.pretrain
    sft = cfg.sft.model_copy(update=dict(
        max_steps=pre.max_steps if steps is None else steps, learning_rate=pre.learning_rate,
        micro_batch_size=pre.micro_batch_size if micro_batch_size is None else micro_batch_size,
        num_ranks=pre.num_ranks, grad_accum_steps=1, warmup_ratio=pre.warmup_ratio, lr_schedule="cosine",
        weight_decay=0.0,
        checkpoint_every=pre.checkpoint_every, max_seq_len=cfg.sft.max_seq_len))
    # Clips are crops and reading rows are text: the SFT overview budgets do not apply.
    video = cfg.video.model_copy(update={"sft_frame_choices": None})
    return cfg.model_copy(update={"sft": sft, "video": video})


def run(cfg: PipelineConfig, base: ArtifactRef, log_line: LogLine = print) -> ArtifactRef:
    """The pretrained base model (kind `base_model`), filed under `<output_dir>/cache/pretrain/<key>`
    by the content it trains on (`pretrain_cache`): reused from there when a pretraining of the same
    content is filed (another world's), else trained or resumed in `<output_dir>/pretrain/<key>`
    (and `pretrain-reading/<key>`), then filed."""
    from paravt_core.miniature import pretrain_cache
    from paravt_core.sft import stage as sft_stage

    if not cfg.model.is_tiny or not cfg.model.pretrain.enabled:
        raise ValueError("perception pretraining is for the tiny model (model.base: tiny, model.pretrain.enabled)")
    corpus = build_corpus(cfg, log_line)
    reading = build_reading_corpus(cfg, corpus, log_line) if cfg.model.pretrain.reading_rows else None
    key = pretrain_cache.pretraining_key(training_config(cfg), base, [c for c in (corpus, reading) if c is not None])
    filed = pretrain_cache.reuse(cfg, key, log_line)
    if filed is not None:
        return filed
    model = sft_stage.run(training_config(cfg), base, corpus, log_line=log_line, stage="pretrain")
    if reading is not None:
        steps = cfg.model.pretrain.reading_steps
        model = sft_stage.run(training_config(cfg, steps), model, reading, log_line=log_line, stage="pretrain-reading")
    return pretrain_cache.store(cfg, key, model, log_line)
