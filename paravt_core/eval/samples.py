"""Benchmark rows of the seven SPEC §7 evaluation splits as uniform `EvalSample`s.

Each split has one loader reading rows in that dataset's own layout (`.jsonl`, `.parquet`
or a `.json` list) and resolving its video under a given directory. `question` is the full
text put to the model. MCQ text follows SPEC §7: "Question: {q}\\nOptions:\\nA. ...\\n
Answer with the option letter only."; the agentic "The video path for this video is: ..."
sentence, and prompt mode `direct`'s own MCQ instruction in place of the last line, are
put in later by the prompt builder (`prompting.py`), not here.

Where the SPEC or the datasets leave a choice, we decide (and depart from common
loaders) as follows:

- Options are stored without letter prefixes. Video-MME's "A. ..." prefixes are checked
  against their position and removed, so the prompt never reads "A. A. ...".
- LVBench and MLVU questions already list their options as "(A) ..." lines: the question
  is kept verbatim with no second "Options:" block (SPEC §7 says so for LVBench). LVBench's
  text has no "Question: " label, as in the release. An MLVU row whose question does not
  list them gets the standard block from `candidates`. The release adds the block to every
  MLVU question, listing the options twice; we do not.
- MLVU answers are letters; a row whose answer is a candidate's text (the original MLVU
  json layout) is mapped to that candidate's letter. Anything else is an error. Real
  MLVU rows carry empty strings among `candidates`: those are dropped and the others keep
  their original letters (SPEC §7: the benchmark's letters are its ground truth; a row
  with candidates ["", X, Y, ""] and answer B is asked with options B and C, answer B; an
  answer naming a blank is an error). When blanks were dropped, the question's "(A) ..."
  lines, if any, are replaced by the standard block of the kept options under their own
  letters, so question, options and answer agree.
- LVBench rows with a null `uid` (seen in real rows) get the stable id
  "lvbench-<12 hex>", the sha256 of the row's video name and question.
- LongVideoBench: "N/A" options are dropped and `correct_choice` (0-based, counted over
  option0..option4) becomes the letter of that option among the kept ones. Its own
  subtitle file name stays in `extra`; only `videomme_wsub` prepends subtitles.
- MMVU rows with question_type "open-ended" are kind "open" with no options and the
  instruction "Answer with a short word or phrase." (SPEC §7 fixes only the MCQ text).
  MMVU's subject (under `metadata`) is the category.
- Charades-STA: the id is "<video stem>_<row number>" (the dataset has no id; a video has
  several captions); timestamps are read as stored (float16 values such as 24.296875 are
  not rounded); the question is the release's (`CHARADES_PROMPT`, from the release's
  `paravt/eval/utils.py`), which asks for "The event happens in the start time - end time".
- videomme_wsub: "This video's subtitles are listed below:\\n{text}\\n\\n" is prepended,
  where text is the cue text of `<videoID>.srt` (markup removed, one cue per line). A video
  without an .srt gets no prefix and `subtitle_path` None, which callers report.
- Videos, relative to the video directory: Video-MME `<videoID>.mp4`; LongVideoBench
  `video_path`; LVBench `video_path` when the row has it (lmms-lab copy), else `<key>.mp4`;
  MLVU `<video_name>`, else `<task folder>/<video_name>` (e.g. `1_plotQA/...`); MMVU the
  part of the `video` URL after "/main/"; Charades-STA `video`.
- A missing video never drops a sample: it sets `video_missing`. A bad row is a
  `RowError` naming the file, the 1-based row number (the line number for .jsonl) and
  the field: `read_split` sets it aside in `LoadedSplit.quarantined` and goes on with
  the other rows; `load_split` raises it. Video paths from rows must be relative and
  free of "..".
"""

from __future__ import annotations

import hashlib
import json
import numbers
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from paravt_core.scoring import MCQ_LETTERS

Kind = Literal["mcq", "grounding", "open"]

MCQ_INSTRUCTION = "Answer with the option letter only."
OPEN_INSTRUCTION = "Answer with a short word or phrase."
SUBTITLE_PREFIX = "This video's subtitles are listed below:\n{text}\n\n"
# paravt/eval/utils.py (EvolvingLMMs-Lab/ParaVT) load_samples, dataset "charades": the question.
CHARADES_PROMPT = (
    "Please find the visual event described by a sentence in the video, determining its starting and ending "
    "times. The format should be: 'The event happens in the start time - end time'. For example, The event "
    "'person turn a light on' happens in the 24.3 - 30.4 seconds. Now I will give you the textual sentence: "
    '"{caption}". Please return its start time and end time.'
)
LONGVIDEOBENCH_OPTION_FIELDS = tuple(f"option{i}" for i in range(5))
LONGVIDEOBENCH_ABSENT_OPTION = "N/A"
MLVU_TASK_DIRS = {
    "plotQA": "1_plotQA",
    "findNeedle": "2_needle",
    "ego": "3_ego",
    "count": "4_count",
    "order": "5_order",
    "anomaly_reco": "6_anomaly_reco",
    "topic_reasoning": "7_topic_reasoning",
}

_INLINE_OPTION = re.compile(r"^\(([A-J])\)[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_SRT_TIMING = re.compile(r"^\d{1,2}:\d{2}:\d{2}[,.]\d{1,3}\s*-->\s*\d{1,2}:\d{2}:\d{2}[,.]\d{1,3}")
_MARKUP = re.compile(r"<[^>]+>")


def option_letters(count: int) -> tuple[str, ...]:
    """The letters of `count` options: ("A", "B", ...)."""
    return tuple(MCQ_LETTERS[:count])


@dataclass(frozen=True)
class EvalSample:
    """One benchmark question, ready to be put to the model (SPEC §7).

    `answer` is an option letter (mcq), the reference text (open) or (start, end)
    seconds equal to (gt_start, gt_end) (grounding). `options` are option texts without
    letter prefixes; option i has letter MCQ_LETTERS[i], unless `letters` gives the options'
    own letters (a benchmark's options with gaps, e.g. MLVU's blanks). `extra` keeps per-dataset
    fields a summary may break down by (a dict, so samples compare but do not hash).
    """

    id: str
    split: str
    video_path: Path
    question: str
    answer: str | tuple[float, float]
    kind: Kind
    options: tuple[str, ...] = ()
    letters: tuple[str, ...] = ()  # empty: A, B, C, ... in order
    gt_start: float | None = None
    gt_end: float | None = None
    duration_group: str | None = None
    category: str | None = None
    subtitle_path: Path | None = None
    video_missing: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.letters and len(self.letters) != len(self.options):
            raise ValueError(f"sample {self.id}: {len(self.letters)} letters for {len(self.options)} options")
        if self.kind == "mcq" and self.answer not in self.option_letters:
            raise ValueError(f"sample {self.id}: answer {self.answer!r} names no option")
        if self.kind == "grounding" and self.answer != (self.gt_start, self.gt_end):
            raise ValueError(f"sample {self.id}: grounding answer must equal (gt_start, gt_end)")

    @property
    def option_letters(self) -> tuple[str, ...]:
        """The letter of each option, in order."""
        return self.letters or option_letters(len(self.options))


class RowError(ValueError):
    """A benchmark row that cannot become a sample; names file, row and field."""

    def __init__(self, source: Path, row: int, field_name: str, problem: str) -> None:
        super().__init__(f"{source}: row {row}: field {field_name!r}: {problem}")
        self.source, self.row, self.field_name, self.problem = source, row, field_name, problem


@dataclass(frozen=True)
class Row:
    """One annotation row plus where it came from, with typed field readers."""

    source: Path
    number: int
    data: Mapping[str, Any]

    def error(self, field_name: str, problem: str) -> RowError:
        return RowError(self.source, self.number, field_name, problem)

    def _get(self, field_name: str) -> Any:
        if field_name not in self.data or self.data[field_name] is None:
            raise self.error(field_name, "missing")
        return self.data[field_name]

    def has(self, field_name: str) -> bool:
        return self.data.get(field_name) is not None

    def text(self, field_name: str) -> str:
        """A non-blank string field, stripped."""
        value = self._get(field_name)
        if not isinstance(value, str) or not value.strip():
            raise self.error(field_name, f"expected non-empty text, got {value!r}")
        return value.strip()

    def real(self, field_name: str) -> float:
        value = self._get(field_name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise self.error(field_name, f"expected a number, got {value!r}")
        return float(value)

    def integer(self, field_name: str) -> int:
        value = self._get(field_name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise self.error(field_name, f"expected an integer, got {value!r}")
        return int(value)

    def sequence(self, field_name: str) -> list[Any]:
        """A list cell; numpy arrays (pandas' parquet list cells) are accepted too."""
        value = self._get(field_name)
        if hasattr(value, "tolist") and not isinstance(value, str):
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            raise self.error(field_name, f"expected a list, got {value!r}")
        return list(value)

    def text_list(self, field_name: str) -> list[str]:
        values = self.sequence(field_name)
        if not all(isinstance(v, str) and v.strip() for v in values):
            raise self.error(field_name, f"expected a list of non-empty texts, got {values!r}")
        return [v.strip() for v in values]

    def mapping(self, field_name: str) -> Mapping[str, Any]:
        value = self._get(field_name)
        if not isinstance(value, Mapping):
            raise self.error(field_name, f"expected an object, got {value!r}")
        return value


RowOrError = Row | RowError


# --- reading rows ---------------------------------------------------------------------


def _jsonl_rows(path: Path) -> Iterator[RowOrError]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                yield RowError(path, number, "(row)", f"not valid JSON: {exc}")
                continue
            yield _checked_row(path, number, data)


def _json_rows(path: Path) -> Iterator[RowOrError]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of row objects")
    for index, item in enumerate(data):
        yield _checked_row(path, index + 1, item)


def _parquet_rows(path: Path) -> Iterator[RowOrError]:
    import pyarrow.parquet as pq  # deferred: keeps `paravt --help` fast

    # to_pylist gives plain lists and dicts, unlike pandas' numpy list cells.
    for index, data in enumerate(pq.read_table(path).to_pylist()):
        yield _checked_row(path, index + 1, data)


def _checked_row(path: Path, number: int, data: Any) -> Row | RowError:
    if not isinstance(data, Mapping):
        return RowError(path, number, "(row)", f"expected an object, got {type(data).__name__}")
    return Row(path, number, data)


_ROW_READERS: dict[str, Callable[[Path], Iterator[RowOrError]]] = {
    ".jsonl": _jsonl_rows,
    ".json": _json_rows,
    ".parquet": _parquet_rows,
}


def read_rows(path: Path) -> Iterator[RowOrError]:
    """Rows of a .jsonl, .json (list) or .parquet annotation file, numbered from 1; a row
    that is not a JSON object comes as its `RowError`, so one bad line stops no reader."""
    path = Path(path)
    reader = _ROW_READERS.get(path.suffix)
    if reader is None:
        raise ValueError(f"{path}: unsupported rows file; use one of {sorted(_ROW_READERS)}")
    if not path.is_file():
        raise FileNotFoundError(f"rows file not found: {path}")
    return reader(path)


# --- videos and subtitles -------------------------------------------------------------


def _safe_relative(row: Row, field_name: str, rel: str) -> PurePosixPath:
    relative = PurePosixPath(rel)
    if not rel or relative.is_absolute() or ".." in relative.parts:
        raise row.error(field_name, f"video path {rel!r} must be relative without '..'")
    return relative


def resolve_video(
    row: Row, field_name: str, video_dir: Path, candidates: Sequence[str]
) -> tuple[Path, bool]:
    """The first candidate that exists under video_dir, else the first one, flagged missing.

    Returns (path, video_missing).
    """
    paths = [video_dir / _safe_relative(row, field_name, rel) for rel in candidates]
    for path in paths:
        if path.is_file():
            return path, False
    return paths[0], True


def srt_to_text(srt: str) -> str:
    """Plain text of an .srt file: one line per cue, index/timing lines and markup removed."""
    lines = [line.strip() for line in srt.lstrip("\ufeff").splitlines()]
    timing_rows = {i for i, line in enumerate(lines) if _SRT_TIMING.match(line)}
    index_rows = {i - 1 for i in timing_rows if i > 0 and lines[i - 1].isdigit()}
    cues: list[list[str]] = []
    for i, line in enumerate(lines):
        if i in timing_rows:
            cues.append([])
        elif line and i not in index_rows and cues:
            cues[-1].append(_MARKUP.sub("", line).strip())
    joined = (" ".join(part for part in cue if part) for cue in cues)
    return "\n".join(text for text in joined if text)


# --- question text --------------------------------------------------------------------


def mcq_question(question: str, options: Sequence[str], letters: Sequence[str] = ()) -> str:
    """SPEC §7 MCQ text with a lettered "Options:" block (`letters`: the options' own, default A, B, ...)."""
    letters = letters or MCQ_LETTERS[: len(options)]
    lettered = [f"{letter}. {text}" for letter, text in zip(letters, options, strict=True)]
    return "\n".join([f"Question: {question}", "Options:", *lettered, MCQ_INSTRUCTION])


def inline_options_question(question: str) -> str:
    """SPEC §7 MCQ text for an MLVU question that already lists its options."""
    return f"Question: {question}\n{MCQ_INSTRUCTION}"


def lvbench_question(question: str) -> str:
    """LVBench's MCQ text: its question (options embedded), then the instruction, with no
    "Question: " label (the release's `paravt/eval/utils.py`, dataset "lvbench")."""
    return f"{question}\n{MCQ_INSTRUCTION}"


def open_question(question: str) -> str:
    return f"Question: {question}\n{OPEN_INSTRUCTION}"


def inline_options(row: Row, field_name: str, question: str) -> list[str]:
    """Texts of the "(A) ..." option lines in a question; letters must run A, B, C, ..."""
    found = _INLINE_OPTION.findall(question)
    letters = "".join(letter for letter, _ in found)
    if letters != MCQ_LETTERS[: len(found)]:
        raise row.error(field_name, f"inline options are lettered {letters!r}, not A, B, C, ...")
    return [text for _, text in found]


def _mcq_answer(row: Row, field_name: str, options: Sequence[str]) -> str:
    answer = row.text(field_name)
    if answer not in option_letters(len(options)):
        raise row.error(field_name, f"{answer!r} is not a letter of the {len(options)} options")
    return answer


def _require_options(row: Row, field_name: str, options: Sequence[str]) -> None:
    if not 1 <= len(options) <= len(MCQ_LETTERS):
        raise row.error(field_name, f"expected 1 to {len(MCQ_LETTERS)} options, "
                                    f"found {len(options)}")


# --- per-split samples ----------------------------------------------------------------


def _videomme_options(row: Row) -> list[str]:
    given = row.text_list("options")
    _require_options(row, "options", given)
    options = []
    for i, option in enumerate(given):
        prefix = f"{MCQ_LETTERS[i]}. "
        if not option.startswith(prefix):
            raise row.error("options", f"option {i} {option!r} does not start with {prefix!r}")
        options.append(option[len(prefix) :].strip())
    return options


def videomme_sample(row: Row, video_dir: Path, split: str = "videomme") -> EvalSample:
    """Video-MME (test): video `<videoID>.mp4`, options "A. ..." stored without prefix."""
    options = _videomme_options(row)
    video_path, missing = resolve_video(row, "videoID", video_dir, [f"{row.text('videoID')}.mp4"])
    return EvalSample(
        id=row.text("question_id"),
        split=split,
        video_path=video_path,
        question=mcq_question(row.text("question"), options),
        answer=_mcq_answer(row, "answer", options),
        kind="mcq",
        options=tuple(options),
        duration_group=row.text("duration"),
        category=row.text("task_type"),
        video_missing=missing,
        extra={"video_id": row.text("video_id"), "domain": row.text("domain"),
               "sub_category": row.text("sub_category")},
    )


def _longvideobench_options(row: Row) -> tuple[list[str], str]:
    """Kept option texts and the answer letter among them."""
    correct = row.integer("correct_choice")
    if not 0 <= correct < len(LONGVIDEOBENCH_OPTION_FIELDS):
        raise row.error("correct_choice", f"{correct} is not an index of option0..option4")
    kept: list[str] = []
    answer = ""
    for index, field_name in enumerate(LONGVIDEOBENCH_OPTION_FIELDS):
        text = row.text(field_name)
        if text == LONGVIDEOBENCH_ABSENT_OPTION:
            continue
        if index == correct:
            answer = MCQ_LETTERS[len(kept)]
        kept.append(text)
    if not answer:
        raise row.error("correct_choice", f"points at option{correct}, which is 'N/A'")
    return kept, answer


def longvideobench_sample(row: Row, video_dir: Path) -> EvalSample:
    """LongVideoBench (validation): video from `video_path`, "N/A" options dropped."""
    options, answer = _longvideobench_options(row)
    video_path, missing = resolve_video(row, "video_path", video_dir, [row.text("video_path")])
    return EvalSample(
        id=row.text("id"),
        split="longvideobench",
        video_path=video_path,
        question=mcq_question(row.text("question"), options),
        answer=answer,
        kind="mcq",
        options=tuple(options),
        duration_group=str(row.integer("duration_group")),
        category=row.text("question_category"),
        video_missing=missing,
        extra={"duration": row.real("duration"), "topic_category": row.text("topic_category"),
               "subtitle_file": row.text("subtitle_path")},
    )


def _lvbench_video(row: Row, video_dir: Path) -> tuple[Path, bool]:
    if row.has("video_path"):
        return resolve_video(row, "video_path", video_dir, [row.text("video_path")])
    return resolve_video(row, "key", video_dir, [f"{row.text('key')}.mp4"])


def lvbench_id(row: Row) -> str:
    """The row's `uid`, or for a null one a stable id from its video name and question."""
    if row.has("uid"):
        uid = row.data["uid"]
        return str(uid) if isinstance(uid, numbers.Integral) and not isinstance(uid, bool) else row.text("uid")
    video = row.text("video_path") if row.has("video_path") else row.text("key")
    digest = hashlib.sha256(json.dumps([video, row.text("question")]).encode()).hexdigest()
    return f"lvbench-{digest[:12]}"


def lvbench_sample(row: Row, video_dir: Path) -> EvalSample:
    """LVBench: options embedded in the question as "(A) ..."; video `<key>.mp4`."""
    question = row.text("question")
    options = inline_options(row, "question", question)
    _require_options(row, "question", options)
    question_types = row.text_list("question_type")
    video_path, missing = _lvbench_video(row, video_dir)
    return EvalSample(
        id=lvbench_id(row),
        split="lvbench",
        video_path=video_path,
        question=lvbench_question(question),
        answer=_mcq_answer(row, "answer", options),
        kind="mcq",
        options=tuple(options),
        category=", ".join(question_types),
        video_missing=missing,
        extra={"question_types": tuple(question_types), "video_type": row.text("type"),
               "time_reference": row.text("time_reference")},
    )


def _mlvu_kept_candidates(row: Row) -> tuple[list[str], list[int]]:
    """The non-blank candidates, stripped, and their positions among the stored ones."""
    stored = row.sequence("candidates")
    if not all(isinstance(text, str) for text in stored):
        raise row.error("candidates", f"expected a list of texts, got {stored!r}")
    kept = [(index, text.strip()) for index, text in enumerate(stored) if text.strip()]
    _require_options(row, "candidates", kept)
    if len(stored) > len(MCQ_LETTERS):
        raise row.error("candidates", f"expected at most {len(MCQ_LETTERS)} candidates, found {len(stored)}")
    return [text for _, text in kept], [index for index, _ in kept]


def _mlvu_answer(row: Row, candidates: Sequence[str], letters: Sequence[str]) -> str:
    """The answer's own letter (module docstring); never re-lettered."""
    answer = row.text("answer")
    stored_letters = MCQ_LETTERS[: len(row.sequence("candidates"))]
    if len(answer) == 1 and answer in stored_letters:
        if answer not in letters:
            raise row.error("answer", f"{answer!r} names a blank candidate")
        return answer
    if answer in candidates:
        return letters[candidates.index(answer)]
    raise row.error("answer", f"{answer!r} is neither an option letter nor a candidate")


def _mlvu_question(row: Row, candidates: Sequence[str], letters: Sequence[str], dropped: bool) -> str:
    question = row.text("question")
    listed = inline_options(row, "question", question)
    if not listed:
        return mcq_question(question, candidates, letters)
    if dropped and ([text.strip() for text in listed] != list(candidates)
                    or tuple(letters) != option_letters(len(candidates))):
        stem = _INLINE_OPTION.sub("", question).strip()
        return mcq_question(stem, candidates, letters)
    if len(listed) != len(candidates):
        raise row.error("question", f"lists {len(listed)} options but there are "
                                    f"{len(candidates)} candidates")
    return inline_options_question(question)


def mlvu_choices(row: Row) -> tuple[list[str], tuple[str, ...], str, str]:
    """(options, their letters, answer letter, question text) of an MLVU row, blanks dropped."""
    candidates, positions = _mlvu_kept_candidates(row)
    letters = tuple(MCQ_LETTERS[i] for i in positions)
    dropped = len(candidates) != len(row.sequence("candidates"))
    return (candidates, letters, _mlvu_answer(row, candidates, letters),
            _mlvu_question(row, candidates, letters, dropped))


def mlvu_sample(row: Row, video_dir: Path) -> EvalSample:
    """MLVU (dev): the question already lists "(A) ..." options; answers are letters.

    The video is `<video_name>` directly under video_dir, or under MLVU's task folder
    (e.g. `1_plotQA/<video_name>`).
    """
    options, letters, answer, question = mlvu_choices(row)
    task = row.text("task_type")
    name = row.text("video_name")
    places = [name] + ([f"{MLVU_TASK_DIRS[task]}/{name}"] if task in MLVU_TASK_DIRS else [])
    video_path, missing = resolve_video(row, "video_name", video_dir, places)
    return EvalSample(
        id=row.text("question_id"),
        split="mlvu",
        video_path=video_path,
        question=question,
        answer=answer,
        kind="mcq",
        options=tuple(options),
        letters=letters if letters != option_letters(len(options)) else (),
        category=task,
        video_missing=missing,
        extra={"duration": row.real("duration")},
    )


def _mmvu_options(row: Row) -> list[str]:
    """Non-empty choices in letter order; trailing empty ones dropped, gaps refused."""
    choices = row.mapping("choices")
    texts = [choices.get(letter) or "" for letter in MCQ_LETTERS]
    if not all(isinstance(text, str) for text in texts):
        raise row.error("choices", f"expected text choices, got {dict(choices)!r}")
    texts = [text.strip() for text in texts]
    while texts and not texts[-1]:
        texts.pop()
    if not all(texts):
        raise row.error("choices", f"empty choice between non-empty ones: {dict(choices)!r}")
    _require_options(row, "choices", texts)
    return texts


def _mmvu_video_relpath(row: Row) -> str:
    url = row.text("video")
    marker = "/main/"
    if marker not in url:
        raise row.error("video", f"URL {url!r} has no {marker!r} part")
    return url.split(marker, 1)[1]


def _mmvu_kind_fields(row: Row) -> dict[str, Any]:
    question_type = row.text("question_type")
    question = row.text("question")
    if question_type == "open-ended":
        return {"kind": "open", "question": open_question(question), "answer": row.text("answer")}
    if question_type != "multiple-choice":
        raise row.error("question_type", f"unknown question type {question_type!r}")
    options = _mmvu_options(row)
    return {"kind": "mcq", "question": mcq_question(question, options), "options": tuple(options),
            "answer": _mcq_answer(row, "answer", options)}


def mmvu_sample(row: Row, video_dir: Path) -> EvalSample:
    """MMVU (validation): multiple-choice rows are "mcq", open-ended rows "open".

    The video is the part of the `video` URL after "/main/" (e.g. `videos/Art/0.mp4`).
    """
    video_path, missing = resolve_video(row, "video", video_dir, [_mmvu_video_relpath(row)])
    metadata = row.mapping("metadata")
    subject = metadata.get("subject")
    if not isinstance(subject, str) or not subject.strip():
        raise row.error("metadata", f"metadata.subject must be text, got {subject!r}")
    return EvalSample(
        id=row.text("id"),
        split="mmvu",
        video_path=video_path,
        category=subject.strip(),
        video_missing=missing,
        extra={"question_type": row.text("question_type")},
        **_mmvu_kind_fields(row),
    )


def _charades_times(row: Row) -> tuple[float, float]:
    values = row.sequence("timestamp")
    if len(values) != 2 or not all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values
    ):
        raise row.error("timestamp", f"expected [start, end] numbers, got {values!r}")
    start, end = float(values[0]), float(values[1])
    if not 0.0 <= start <= end:
        raise row.error("timestamp", f"expected 0 <= start <= end, got {values!r}")
    return start, end


def charades_sample(row: Row, video_dir: Path) -> EvalSample:
    """Charades-STA (test): temporal grounding of `caption`, scored by IoU."""
    start, end = _charades_times(row)
    video = row.text("video")
    video_path, missing = resolve_video(row, "video", video_dir, [video])
    caption = row.text("caption")
    return EvalSample(
        id=f"{PurePosixPath(video).stem}_{row.number}",
        split="charades",
        video_path=video_path,
        question=CHARADES_PROMPT.format(caption=caption),
        answer=(start, end),
        kind="grounding",
        gt_start=start,
        gt_end=end,
        video_missing=missing,
        extra={"caption": caption},
    )


# --- loaders --------------------------------------------------------------------------


@dataclass(frozen=True)
class QuarantinedRow:
    """A row set aside by `read_split`: where it is and why it cannot become a sample."""

    source: str
    row: int
    field: str
    reason: str

    @classmethod
    def of(cls, error: RowError) -> QuarantinedRow:
        return cls(str(error.source), error.row, error.field_name, error.problem)

    def error(self) -> RowError:
        return RowError(Path(self.source), self.row, self.field, self.reason)

    def to_record(self) -> dict[str, Any]:
        return {"file": self.source, "row": self.row, "field": self.field, "reason": self.reason}


@dataclass(frozen=True)
class LoadedSplit:
    """A split's samples in row order, and the rows set aside."""

    split: str
    samples: list[EvalSample]
    quarantined: list[QuarantinedRow]


SampleBuilder = Callable[[Row, Path], EvalSample]
SAMPLE_BUILDERS: dict[str, SampleBuilder] = {
    "videomme": videomme_sample,
    "videomme_wsub": lambda row, video_dir: videomme_sample(row, video_dir, split="videomme_wsub"),
    "videomme_val": lambda row, video_dir: videomme_sample(row, video_dir, split="videomme_val"),
    "longvideobench": longvideobench_sample,
    "lvbench": lvbench_sample,
    "mlvu": mlvu_sample,
    "mmvu": mmvu_sample,
    "charades": charades_sample,
}
SPLITS = tuple(SAMPLE_BUILDERS)


def _with_subtitles(sample: EvalSample, srt_path: Path, cache: dict[Path, str]) -> EvalSample:
    if not srt_path.is_file():
        return sample
    if srt_path not in cache:
        cache[srt_path] = srt_to_text(srt_path.read_text(encoding="utf-8"))
    prefix = SUBTITLE_PREFIX.format(text=cache[srt_path])
    return replace(sample, question=prefix + sample.question, subtitle_path=srt_path)


def _split_builder(split: str, subtitle_dir: Path | None, video_dir: Path) -> SampleBuilder:
    """The split's builder; videomme_wsub prepends `<subtitle_dir>/<videoID>.srt` text (SPEC §7),
    subtitle_dir defaulting to video_dir."""
    if split not in SAMPLE_BUILDERS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if split != "videomme_wsub":
        if subtitle_dir is not None:
            raise ValueError(f"subtitle_dir applies to videomme_wsub only, not {split!r}")
        return SAMPLE_BUILDERS[split]
    srt_dir = Path(subtitle_dir or video_dir)
    cache: dict[Path, str] = {}

    def build(row: Row, videos: Path) -> EvalSample:
        sample = SAMPLE_BUILDERS[split](row, videos)
        return _with_subtitles(sample, srt_dir / f"{row.text('videoID')}.srt", cache)

    return build


def read_split(
    split: str, rows_path: Path, video_dir: Path, subtitle_dir: Path | None = None
) -> LoadedSplit:
    """Samples of one SPEC §7 split; a row that cannot become a sample (bad JSON, a bad
    field, an id seen on an earlier row) is quarantined with its file, row and reason
    instead of stopping the split. subtitle_dir applies to `videomme_wsub` only."""
    video_dir = Path(video_dir)
    build = _split_builder(split, subtitle_dir, video_dir)
    samples: list[EvalSample] = []
    quarantined: list[QuarantinedRow] = []
    seen: dict[str, int] = {}
    for item in read_rows(rows_path):
        try:
            if isinstance(item, RowError):
                raise item
            sample = build(item, video_dir)
            if sample.id in seen:
                raise item.error("(id)", f"id {sample.id!r} was already used by row {seen[sample.id]}")
        except RowError as error:
            quarantined.append(QuarantinedRow.of(error))
            continue
        seen[sample.id] = item.number
        samples.append(sample)
    return LoadedSplit(split, samples, quarantined)


def load_split(
    split: str, rows_path: Path, video_dir: Path, subtitle_dir: Path | None = None
) -> list[EvalSample]:
    """Samples of one SPEC §7 split, strictly: the first bad row raises its `RowError`
    (for rows already through the data contracts; `read_split` quarantines instead)."""
    loaded = read_split(split, rows_path, video_dir, subtitle_dir)
    if loaded.quarantined:
        raise loaded.quarantined[0].error()
    return loaded.samples


def missing_videos(samples: Sequence[EvalSample]) -> list[EvalSample]:
    """The samples whose video file was not found (they are kept, not dropped)."""
    return [sample for sample in samples if sample.video_missing]
