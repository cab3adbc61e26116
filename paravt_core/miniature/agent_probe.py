"""Can the main agent read its own transcript? A teacher-forced probe of the last step (#15).

`paravt miniature reading-probe` scores the reading skill on reading rows, where the options stand
about a hundred tokens before the end (median 112 on 200 held-out rows). In an agent transcript they stand hundreds of tokens back
(the overview frames, the tool calls and the sub-agents' reports come between), and the same
model may read one and not the other. This probe draws held-out multiple-choice questions on
videos of the config's world from a stream of their own, writes the teacher's tool trace for
each (`data.synth.traces.tool_trace`, the SFT rows' layout and prompts), renders the video
and feeds the whole conversation once (teacher forcing: frames, calls and the true reports
included). The final turn is scored as the reading probe scores a reading answer
(`reading_probe.check_spans`): value, option lines, the value beside each option, verdicts,
letter, and the whole chain; `distance` is the median number of tokens from the question's
options to the end of the conversation.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.data.synth.paravt import TrainVideo, sft_messages
from paravt_core.data.synth.questions import OptionStyle
from paravt_core.data.synth.render import encode_mp4
from paravt_core.data.synth.traces import tool_trace
from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id
from paravt_core.miniature.forced import ProbeScores, score_row, teacher_forced
from paravt_core.miniature.pretrain import mcq_event_question
from paravt_core.miniature.reading_probe import check_spans
from paravt_core.model.loading import build_model, load_processor

# lazy: torch (2.3 s to import) only where a model runs: `paravt miniature` imports this module to
# check a command's config, model folder and split first (a config error took 0.9 s; 6.9 s with
# these imports at the top).

PROBE_STREAM = "probe-agent"  # derived_rng stream; training videos come from the data stage's
PARTS = ("value", "options", "values", "verdicts", "letter", "chain")


@dataclass(frozen=True)
class AgentProbe(ProbeScores):
    PREFIX = "agent"

    rows: int
    distance: float  # median tokens from the options to the end of the conversation
    value: float
    options: float
    values: float
    verdicts: float
    letter: float
    chain: float


def probe_conversation(cfg: PipelineConfig, index: int, seed: int, video_dir: Path) -> list[dict]:
    """The SFT-layout messages of held-out probe question `index` (its video rendered into
    `video_dir`): a multiple-choice question on the video's event and the teacher's tool trace."""
    synth = cfg.data.synth
    rng = derived_rng(synth.seed, PROBE_STREAM, seed, index)
    spec = sample_video(rng, synth, youtube_like_id(rng))
    topics = tuple(synth.question_topics) if synth.question_topics else None
    question = mcq_event_question(rng, spec, topics, OptionStyle.of(synth))
    video_file = video_dir / f"{spec.video_id}.mp4"
    video_file.write_bytes(encode_mp4(spec, synth.codec))
    trace = tool_trace(rng, spec, question, video_file.name, synth.max_calls_per_trace, synth.max_crop_s,
                       cover=synth.teacher_windows == "cover", final_reasoning=synth.final_reasoning,
                       crop_opening=synth.crop_opening)
    return sft_messages(trace, TrainVideo(spec=spec, sentinel=str(video_file)), synth.prompts)


def agent_probe(model_dir: Path, cfg: PipelineConfig, rows: int = 64, seed: int = 0) -> AgentProbe:
    """Score the model in `model_dir` on `rows` held-out teacher transcripts (module docstring)."""
    from paravt_core.sft.dataset import FrameCache, FrameSampling, load_image
    from paravt_core.sft.encode import IGNORE_INDEX, encode_conversation

    processor = load_processor(model_dir)
    model = build_model(cfg.model, model_dir, dtype="float32").eval()
    sampling = FrameSampling.from_config(cfg.video)  # as the SFT worker samples
    totals = dict.fromkeys(PARTS, 0)
    distances = []
    with tempfile.TemporaryDirectory(prefix="agent-probe-") as tmp:
        cache = FrameCache(Path(tmp) / "frames", sampling)
        for index in range(rows):
            messages = probe_conversation(cfg, index, seed, Path(tmp))
            sample = encode_conversation(messages, processor, cache.load, load_image, None,  # as SFT encodes
                                         (sampling.min_pixels, sampling.max_pixels))
            trained = (sample.labels != IGNORE_INDEX).nonzero().flatten().tolist()
            final = [trained[-1]]  # the last assistant turn: the last run of trained positions
            for position in reversed(trained[:-1]):
                if position != final[0] - 1:
                    break
                final.insert(0, position)
            text, offsets, correct = teacher_forced(model, processor.tokenizer, sample, final)
            for part, ok in score_row(correct, offsets, check_spans(text)).items():
                totals[part] += ok
            whole = processor.tokenizer.decode(sample.input_ids.tolist())
            distances.append(len(processor.tokenizer(whole[whole.rindex("Options:"):], add_special_tokens=False)["input_ids"]))
    return AgentProbe(rows=rows, distance=float(statistics.median(distances)),
                      **{part: totals[part] / rows for part in PARTS})
