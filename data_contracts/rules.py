"""The contract rules as pure functions: each returns None for a good value, else the problem.

These functions know nothing of Great Expectations; `data_contracts.expectations` wraps each
one in a GX expectation, and `data_contracts.report` calls it again to say why a failing
row failed. Values may be plain Python (`pyarrow` `to_pylist`, JSON) or what
`pd.read_parquet` gives (numpy arrays for list cells); both are accepted.

Row formats (SPEC §8 and the loaders of `paravt_core.eval.samples`, SPEC §7):

- SFT `messages`: a non-empty list of turns `{role, content}`; `content` is a string or a
  non-empty list of items `{"type": "text", "text"}`, `{"type": "video_url", "video_url":
  {"url"}}` or `{"type": "image_url", "image_url": {"url"}}`; a video item may carry
  `video_start` / `video_end` seconds (a sub-agent row's crop, 0 <= start < end), or, on a
  whole video, `nframes` (the row's own overview budget, a positive whole number).
- RL `prompt`: turns with string content; `<video>` marks where the one video goes.
- RL `extra_info`: a JSON object with `answer`, `question_type` (mcq | tvg | oe) and
  optionally `question`. A ground truth is valid when the SPEC §4.2 scorer of its type can
  credit it: an mcq answer is one letter A-D, a tvg answer holds an `[s, e]` pair with
  s < e, an oe answer has at least one word after normalization.
- Media references are local after materialize (SPEC §8): `file://<root>/<sentinel>` URLs
  (or absolute paths, which the SFT encoder also reads) naming existing files; with a
  media root given, the file (symbolic links resolved) must lie inside it, so a row
  pointing at `file:///etc/passwd` or climbing out with `..` fails.
- Media health (when the caller names a cache folder): every SFT / RL `videos` entry and
  every evaluation row's video decodes, has frames and a duration
  (`paravt_core.video.health`, verdicts cached by content hash).
- SFT `messages` stored as a JSON string (some releases do; materialize and the SFT reader
  accept it) are decoded before these rules (`decoded_messages`).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from paravt_core.eval import samples
from paravt_core.scoring import MCQ_LETTERS
from paravt_core.rewards import QUESTION_TYPES, mcq_accuracy, token_f1, tvg_accuracy

Problem = str | None

CHAT_ROLES = ("system", "user", "assistant", "tool")
CONTENT_ITEM_TYPES = ("text", "video_url", "image_url")
MEDIA_ITEM_TYPES = ("video_url", "image_url")
VIDEO_MARKER = "<video>"
KINDS = ("text", "integer", "number", "text_list", "mapping")
# An option line of an MCQ prompt: "A. red", "A) red", "(A) red" or "A: red".
_PROMPT_OPTION = re.compile(r"^\s*\(?([A-J])[.):]\s*\S", re.MULTILINE)
# When the SPEC §4.2 scorer of each type can credit a ground truth (scored against itself).
_SCORABLE: dict[str, Callable[[str], bool]] = {
    "mcq": lambda answer: mcq_accuracy(answer, answer) == 1.0,
    "tvg": lambda answer: tvg_accuracy(answer, answer) == 1.0,
    "oe": lambda answer: token_f1(answer, answer) > 0.0,
}
_ANSWER_FORMS = {
    "mcq": "one letter A-D",
    "tvg": "an [s, e] pair of seconds with s < e",
    "oe": "a phrase with at least one word",
}


# --- value helpers ------------------------------------------------------------------


def as_list(value: Any) -> list | None:
    """A list cell as a list (numpy arrays from pandas included), else None."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        converted = value.tolist()
        return converted if isinstance(converted, list) else None
    return None


def is_text(value: Any) -> bool:
    """A string with at least one non-blank character."""
    return isinstance(value, str) and bool(value.strip())


def is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def short(value: Any, width: int = 60) -> str:
    """`repr` of a value cut to `width` characters, for failure tables."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# --- column kinds (required columns and types) -------------------------------------------


def kind_problem(value: Any, kind: str) -> Problem:
    """`kind` is one of KINDS: non-blank text, integer, finite number, non-empty list of
    non-blank texts, or mapping (a struct cell or JSON object)."""
    if kind == "text":
        return None if is_text(value) else f"expected non-blank text, got {short(value)}"
    if kind == "integer":
        return None if is_integer(value) else f"expected an integer, got {short(value)}"
    if kind == "number":
        return None if is_number(value) else f"expected a finite number, got {short(value)}"
    if kind == "text_list":
        items = as_list(value)
        if items and all(is_text(item) for item in items):
            return None
        return f"expected a non-empty list of non-blank texts, got {short(value)}"
    if kind == "mapping":
        return None if isinstance(value, Mapping) else f"expected an object, got {short(value)}"
    raise ValueError(f"unknown column kind {kind!r}; expected one of {', '.join(KINDS)}")


# --- chat turns (SFT messages, RL prompt) ----------------------------------------------


def media_url(item: Mapping[str, Any]) -> Any:
    """The url of a `video_url` / `image_url` item: `{"video_url": {"url": u}}` or a bare string."""
    payload = item.get(item.get("type"))
    return payload.get("url") if isinstance(payload, Mapping) else payload


def _content_item_problem(item: Any) -> Problem:
    if not isinstance(item, Mapping):
        return f"content item {short(item)} is not an object"
    kind = item.get("type")
    if kind not in CONTENT_ITEM_TYPES:
        return f"content item type {kind!r} is not one of {', '.join(CONTENT_ITEM_TYPES)}"
    if kind == "text":
        return None if isinstance(item.get("text"), str) else "text item without a text string"
    if not is_text(media_url(item)):
        return f"{kind} item without a url"
    return (_window_problem(item) or _nframes_problem(item)) if kind == "video_url" else None


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def _window_problem(item: Mapping[str, Any]) -> Problem:
    """A video item showing one window (a sub-agent's crop, SPEC §3) has 0 <= video_start < video_end."""
    start, end = (None if _is_nan(item.get(k)) else item.get(k) for k in ("video_start", "video_end"))
    if start is None and end is None:
        return None
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (start, end))
    if not numbers or not 0 <= start < end:
        return f"video window video_start={start!r} video_end={end!r} must be two numbers with 0 <= start < end"
    return None


def _nframes_problem(item: Mapping[str, Any]) -> Problem:
    """A whole-video item may set its own overview budget: `nframes`, a positive whole number."""
    value = item.get("nframes")
    if value is None or _is_nan(value):
        return None
    whole = isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 1:
        return f"video item nframes={value!r} must be a positive whole number of frames"
    if item.get("video_start") is not None and not _is_nan(item.get("video_start")):
        return f"video item nframes={value!r} on a window: a crop's frames follow SPEC §3, not an overview budget"
    return None


def _turn_problem(turn: Any, content: str) -> Problem:
    if not isinstance(turn, Mapping) or not isinstance(turn.get("role"), str):
        return f"is not a {{role, content}} object: {short(turn)}"
    body = turn.get("content")
    if is_text(body):
        return None
    if content == "text":
        return f"({turn['role']}) content must be non-blank text, got {short(body)}"
    items = as_list(body)
    if not items:
        return f"({turn['role']}) content must be text or a non-empty list of items, got {short(body)}"
    problems = (_content_item_problem(item) for item in items)
    found = next((p for p in problems if p), None)
    return f"({turn['role']}) {found}" if found else None


def chat_turns_problem(value: Any, content: str = "items") -> Problem:
    """A non-empty list of turns; `content` "items" (SFT: text or content items) or "text"
    (RL prompt: text only, SPEC §8)."""
    turns = as_list(value)
    if not turns:
        return f"expected a non-empty list of chat turns, got {short(value)}"
    for number, turn in enumerate(turns):
        found = _turn_problem(turn, content)
        if found:
            return f"turn {number} {found}"
    return None


def _roles(value: Any) -> list[Any]:
    return [turn.get("role") for turn in as_list(value) or [] if isinstance(turn, Mapping)]


def chat_roles_problem(value: Any, roles: Sequence[str] = CHAT_ROLES) -> Problem:
    """Every turn's role is one of `roles`."""
    for number, role in enumerate(_roles(value)):
        if role not in roles:
            return f"turn {number} has role {role!r}; allowed: {', '.join(roles)}"
    return None


def final_role_problem(value: Any, role: str) -> Problem:
    """The last turn has `role` (SFT: assistant, the trained answer; RL: user, the prompt)."""
    roles = _roles(value)
    if roles and roles[-1] == role:
        return None
    return f"last turn is {roles[-1] if roles else None!r}, expected {role!r}"


# --- videos and media files ------------------------------------------------------------


def video_list_problem(value: Any, entry: str = "path") -> Problem:
    """A non-empty list of videos: "path" entries are texts (SFT `videos`), "mapping"
    entries are `{"video": path, ...}` (RL `videos`, SPEC §8)."""
    videos = as_list(value)
    if not videos:
        return f"expected a non-empty list of videos, got {short(value)}"
    for number, video in enumerate(videos):
        path = video.get("video") if entry == "mapping" and isinstance(video, Mapping) else video
        if entry == "mapping" and not isinstance(video, Mapping):
            return f"video {number} is not a {{'video': path}} object: {short(video)}"
        if not is_text(path):
            return f"video {number} has no path: {short(video)}"
    return None


def media_references(value: Any) -> list[str]:
    """Media paths/URLs a cell names: turns' media items, text entries, `{"video": p}` entries."""
    references = []
    for element in as_list(value) or []:
        if isinstance(element, str):
            references.append(element)
        elif isinstance(element, Mapping) and "content" in element:
            items = as_list(element.get("content")) or []
            urls = (media_url(i) for i in items if isinstance(i, Mapping) and i.get("type") in MEDIA_ITEM_TYPES)
            references.extend(url for url in urls if isinstance(url, str))
        elif isinstance(element, Mapping) and isinstance(element.get("video"), str):
            references.append(element["video"])
    return references


def local_path(reference: str) -> Path | None:
    """The local file a materialized reference names: a `file://` URL or an absolute path."""
    parsed = urlparse(reference)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and os.path.isabs(reference):
        return Path(reference)
    return None


def outside_root_problem(path: Path, media_root: str) -> Problem:
    """The file, links resolved, lies inside `media_root`."""
    root = Path(media_root).resolve()
    resolved = path.resolve()
    if resolved == root or root not in resolved.parents:
        return f"{path} lies outside the media root {root}; rows may only name files the data stage unpacked"
    return None


def media_files_problem(value: Any, is_file: Callable[[str], bool] = os.path.isfile,
                        media_root: str | None = None) -> Problem:
    """Every media reference of the cell is local (SPEC §8 materialize), inside `media_root`
    when one is given, and exists."""
    for reference in media_references(value):
        path = local_path(reference)
        if path is None:
            return f"{reference!r} is not a file:// URL or absolute path; run the materialize step"
        if media_root is not None and (outside := outside_root_problem(path, media_root)):
            return outside
        if not is_file(str(path)):
            return f"{path} does not exist"
    return None


def _health_problem(path: Path, health_cache: str) -> Problem:
    from paravt_core.video.health import health_cache as cache_for

    verdict = cache_for(health_cache).check(path)
    return None if verdict.ok else f"video {path} cannot be used: {verdict.problem}"


def health_paths(value: Any, media_root: str | None = None) -> list[Path]:
    """The files `video_health_problem` reads for a cell: its existing local references, and
    with `media_root` only those inside it."""
    paths = []
    for reference in media_references(value):
        path = local_path(reference)
        if path is None or (media_root is not None and outside_root_problem(path, media_root)):
            continue
        if path.is_file():
            paths.append(path)
    return paths


def video_health_problem(value: Any, health_cache: str, media_root: str | None = None) -> Problem:
    """Every existing local video the cell names decodes, with frames and a duration.
    References that are not local existing files, or (with `media_root`) lie outside the
    media root, are left to `media_files_problem`: containment is checked before a file is
    read, so a row pointing at a huge or hostile file elsewhere is never hashed or decoded."""
    for path in health_paths(value, media_root):
        if problem := _health_problem(path, health_cache):
            return problem
    return None


def decoded_messages(value: Any) -> Any:
    """An SFT `messages` cell with a JSON-string value decoded; anything else unchanged
    (a string that does not parse stays a string and fails the chat-turn rule)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def one_video_marker_problem(row: Mapping[str, Any]) -> Problem:
    """An RL prompt holds exactly one `<video>` marker and the row exactly one video: the
    rollout puts the sample's own video there (SPEC §2, `EpisodePrompt`)."""
    turns = as_list(row.get("prompt")) or []
    texts = [t.get("content") for t in turns if isinstance(t, Mapping) and isinstance(t.get("content"), str)]
    markers = sum(text.count(VIDEO_MARKER) for text in texts)
    videos = len(as_list(row.get("videos")) or [])
    if markers == 1 and videos == 1:
        return None
    return f"prompt has {markers} {VIDEO_MARKER} markers and the row {videos} videos; expected 1 and 1"


# --- RL ground truth (SPEC §4.2) -------------------------------------------------------


def parse_ground_truth(value: Any) -> dict | None:
    """`extra_info` as a dict, or None when it is not a JSON object."""
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def ground_truth_problem(value: Any) -> Problem:
    """`extra_info` is a JSON object with a text `answer`, a `question_type` in mcq | tvg | oe
    and, if present, a text `question` (SPEC §8)."""
    truth = parse_ground_truth(value)
    if truth is None:
        return f"not a JSON object: {short(value)}"
    if not is_text(truth.get("answer")):
        return f"answer must be non-blank text, got {short(truth.get('answer'))}"
    if truth.get("question_type") not in QUESTION_TYPES:
        return f"question_type {truth.get('question_type')!r} is not one of {', '.join(QUESTION_TYPES)}"
    if "question" in truth and not isinstance(truth["question"], str):
        return f"question must be text, got {short(truth['question'])}"
    return None


def scorable_answer_problem(value: Any) -> Problem:
    """The SPEC §4.2 scorer of the question type can credit the answer: mcq and tvg answers
    score 1 against themselves, an oe answer has a token F1 above 0 against itself.

    Rows without a well-formed ground truth are left to `ground_truth_problem`.
    """
    truth = parse_ground_truth(value)
    if truth is None or ground_truth_problem(value):
        return None
    answer, question_type = truth["answer"], truth["question_type"]
    if _SCORABLE[question_type](answer):
        return None
    return f"{question_type} answer {short(answer)} is not {_ANSWER_FORMS[question_type]} (SPEC §4.2)"


def _prompt_option_letters(turns: Any) -> list[str]:
    user_texts = [
        t.get("content")
        for t in as_list(turns) or []
        if isinstance(t, Mapping) and t.get("role") == "user" and isinstance(t.get("content"), str)
    ]
    return [letter for text in user_texts for letter in _PROMPT_OPTION.findall(text)]


def prompt_option_problem(row: Mapping[str, Any]) -> Problem:
    """An mcq answer letter is among the options the prompt's user turns list."""
    truth = parse_ground_truth(row.get("extra_info"))
    if truth is None or truth.get("question_type") != "mcq" or not isinstance(truth.get("answer"), str):
        return None
    letters = _prompt_option_letters(row.get("prompt"))
    if not letters:
        return "mcq prompt lists no lettered options"
    answer = truth["answer"].strip().upper()
    return None if answer in letters else f"answer {answer!r} is not among the prompt's options {''.join(letters)}"


# --- row identity --------------------------------------------------------------------


def identity_key(value: Any) -> Any:
    """A hashable stand-in for an id value: ids are texts; anything else compares by repr."""
    return value if isinstance(value, (str, int, float)) else repr(value)


def first_occurrences(values: Sequence[Any]) -> list[bool]:
    """True where a value has not been seen in an earlier row (the first copy is kept)."""
    seen: set[Any] = set()
    firsts = []
    for key in map(identity_key, values):
        firsts.append(key not in seen)
        seen.add(key)
    return firsts


# --- evaluation splits (SPEC §7, layouts of paravt_core.eval.samples) --------------------


def _option_texts(value: Any) -> list | None:
    options = as_list(value)
    return options if options and all(isinstance(o, str) for o in options) else None


def lettered_options_problem(value: Any) -> Problem:
    """Video-MME options: 1 to 10 texts starting "A. ", "B. ", ... in order."""
    options = _option_texts(value)
    if not options or len(options) > len(MCQ_LETTERS):
        return f"expected 1 to {len(MCQ_LETTERS)} option texts, got {short(value)}"
    for index, option in enumerate(options):
        prefix = f"{MCQ_LETTERS[index]}. "
        if not option.startswith(prefix) or not option[len(prefix) :].strip():
            return f"option {index} {short(option)} does not start with {prefix!r} and a text"
    return None


def time_window_problem(value: Any) -> Problem:
    """A grounding window: two finite numbers with 0 <= start < end (seconds)."""
    window = as_list(value)
    if not window or len(window) != 2 or not all(is_number(v) for v in window):
        return f"expected [start, end] numbers, got {short(value)}"
    start, end = float(window[0]), float(window[1])
    return None if 0.0 <= start < end else f"expected 0 <= start < end, got [{start}, {end}]"


def _answer_among(answer: Any, letters: Sequence[str]) -> Problem:
    if isinstance(answer, str) and answer.strip() in letters:
        return None
    return f"answer {short(answer)} is not a letter of the options {''.join(letters) or '(none)'}"


def _inline_letters(question: Any) -> list[str] | str:
    """Letters of a question's "(A) ..." lines, or the problem with their lettering."""
    if not isinstance(question, str):
        return f"question is not text: {short(question)}"
    try:
        found = samples.inline_options(samples.Row(Path("-"), 0, {}), "question", question)
    except samples.RowError:
        return "the question's (A) ... option lines are not lettered A, B, C, ..."
    return list(samples.option_letters(len(found)))


def _videomme_answer(row: Mapping[str, Any]) -> Problem:
    options = _option_texts(row.get("options")) or []
    return _answer_among(row.get("answer"), samples.option_letters(len(options)))


def _longvideobench_answer(row: Mapping[str, Any]) -> Problem:
    fields = samples.LONGVIDEOBENCH_OPTION_FIELDS
    choice = row.get("correct_choice")
    if not is_integer(choice) or not 0 <= choice < len(fields):
        return f"correct_choice {short(choice)} is not an index of option0..option{len(fields) - 1}"
    if row.get(fields[choice]) == samples.LONGVIDEOBENCH_ABSENT_OPTION:
        return f"correct_choice {choice} points at an absent ({samples.LONGVIDEOBENCH_ABSENT_OPTION}) option"
    return None


def _lvbench_answer(row: Mapping[str, Any]) -> Problem:
    letters = _inline_letters(row.get("question"))
    if isinstance(letters, str):
        return letters
    return _answer_among(row.get("answer"), letters) if letters else "the question lists no (A) ... options"


def _mlvu_answer(row: Mapping[str, Any]) -> Problem:
    """The loader's own reading (blank candidates dropped, letters kept), so the
    contract and the loader agree on what the answer names."""
    try:
        samples.mlvu_choices(samples.Row(Path("-"), 0, row))
    except samples.RowError as error:
        return error.problem
    return None


def _mmvu_answer(row: Mapping[str, Any]) -> Problem:
    question_type = row.get("question_type")
    if question_type == "open-ended":
        return None if is_text(row.get("answer")) else f"open-ended answer {short(row.get('answer'))} is blank"
    choices = row.get("choices")
    if not isinstance(choices, Mapping):
        return f"choices is not an object: {short(choices)}"
    texts = [choices.get(letter) or "" for letter in MCQ_LETTERS]
    if not all(isinstance(text, str) for text in texts):
        return f"choices must be texts: {short(dict(choices))}"
    texts = [text.strip() for text in texts]
    while texts and not texts[-1]:
        texts.pop()
    if not texts or not all(texts):
        return f"choices must be non-empty from A on, without gaps: {short(dict(choices))}"
    return _answer_among(row.get("answer"), samples.option_letters(len(texts)))


ANSWER_RULES: dict[str, Callable[[Mapping[str, Any]], Problem]] = {
    "videomme": _videomme_answer,
    "longvideobench": _longvideobench_answer,
    "lvbench": _lvbench_answer,
    "mlvu": _mlvu_answer,
    "mmvu": _mmvu_answer,
}


def mcq_answer_problem(row: Mapping[str, Any], layout: str) -> Problem:
    """The answer names one of the row's options, in the dataset's `layout` (SPEC §7)."""
    return ANSWER_RULES[layout](row)


def build_sample(row: Mapping[str, Any], split: str, video_dir: str) -> samples.EvalSample:
    """The split loader's sample for one row (raises `samples.RowError` on a bad row)."""
    return samples.SAMPLE_BUILDERS[split](samples.Row(Path("-"), 0, row), Path(video_dir))


def loads_as_sample_problem(row: Mapping[str, Any], split: str) -> Problem:
    """The split's loader (`paravt_core.eval.samples`) accepts the row."""
    try:
        build_sample(row, split, ".")
    except (samples.RowError, ValueError) as error:
        return str(error).removeprefix("-: row 0: ")
    return None


def subtitle_path(row: Mapping[str, Any], subtitle_dir: str) -> Path:
    """Where `load_videomme_wsub` looks for the row's subtitles: `<subtitle_dir>/<videoID>.srt`."""
    return Path(subtitle_dir) / f"{str(row.get('videoID')).strip()}.srt"


def eval_health_path(row: Mapping[str, Any], split: str, video_dir: str) -> Path | None:
    """The file `eval_video_health_problem` reads for a row: its video, when the loader finds it."""
    try:
        sample = build_sample(row, split, video_dir)
    except (samples.RowError, ValueError):
        return None
    return None if sample.video_missing else sample.video_path


def eval_video_health_problem(row: Mapping[str, Any], split: str, video_dir: str, health_cache: str) -> Problem:
    """The row's video, when the loader finds it, decodes with frames and a duration."""
    path = eval_health_path(row, split, video_dir)
    return None if path is None else _health_problem(path, health_cache)


def media_exist_problem(row: Mapping[str, Any], split: str, video_dir: str, subtitle_dir: str | None = None) -> Problem:
    """The loader finds the row's video under video_dir; for videomme_wsub with a
    subtitle_dir, its `.srt` exists too. Rows the loader rejects are left to
    `loads_as_sample_problem`."""
    try:
        sample = build_sample(row, split, video_dir)
    except (samples.RowError, ValueError):
        return None
    if sample.video_missing:
        return f"video {sample.video_path} not found"
    if split == "videomme_wsub" and subtitle_dir is not None:
        srt = subtitle_path(row, subtitle_dir)
        return None if srt.is_file() else f"subtitles {srt} not found"
    return None

