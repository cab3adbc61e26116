"""Parsing and validation of the main agent's `crop_video` calls (SPEC §2).

A turn may hold several call blocks. Two envelopes are accepted:

- `<tool_call>{"name": "crop_video", "arguments": {...}}</tool_call>` (kind "json");
- `<tool_code>crop_video(video_path="v.mp4", start_time=10, end_time=20)</tool_code>`
  (kind "python"), also positional `crop_video("v.mp4", 10, 20)`, wrapped in
  `print(...)`, written as `default_api.crop_video(...)`, or with a stray quote before the
  final `)`.

Python-style calls are read with `ast.parse` of the single call expression; each argument
is then read with `ast.literal_eval` of its own node, so only literals are accepted and no
model-written code is ever evaluated.

One `<tool_code>` block may hold several calls, one per line (SPEC §2), e.g. a bare
`crop_video(...)` then a `print(crop_video(...))` with a stray quote. A body that does not
parse as one call is split into calls at each line that opens a call (`name(` or
`print(name(` at the line's start); lines that open none continue the call above, so a
call may still span lines. Each call becomes its own entry: a malformed line yields an error
entry naming the line, and the good lines of the block still run. `ParsedBlock.index`
counts calls, so it is unique within a turn.

Where this departs from the release (SPEC §2):
- Parsing is per block. A malformed block becomes a `ParsedBlock` carrying an error
  message (for an error tool response) and the valid blocks of the same turn are kept; the
  release drops every call of a turn when one JSON block is malformed.
- A block whose close tag is missing ends at the next call opener, at `<|im_end|>` or at
  the end of the text, so a generation stopped on the close tag still yields its call.
- The model-written `video_path` is kept only as untrusted text (`raw_video_path`); a call
  always reads the sample's own video and this module never touches the file system.
- Arguments other than video_path, start_time, end_time and the optional num_frames are
  rejected with an error naming them, rather than silently ignored.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

TOOL_NAME = "crop_video"
ARGUMENT_ORDER = ("video_path", "start_time", "end_time", "num_frames")
REQUIRED_ARGUMENTS = ARGUMENT_ORDER[:3]

BlockKind = Literal["json", "python"]
_KIND_OF_TAG: dict[str, BlockKind] = {"tool_call": "json", "tool_code": "python"}

# A block ends at its own close tag, else at the next call opener, `<|im_end|>` or the end.
_BLOCK_RE = re.compile(
    r"<(tool_call|tool_code)>(.*?)(?=</\1>|<tool_call>|<tool_code>|<\|im_end\|>|\Z)",
    re.DOTALL,
)
# A quote right before the closing parenthesis (or parentheses) of the whole call.
_STRAY_QUOTE_RE = re.compile(r"""["']\s*(\)+)\s*\Z""")
_CLOCK_RE = re.compile(r"\A(?:(?P<hours>\d+):)?(?P<minutes>\d+):(?P<seconds>\d+(?:\.\d*)?)\Z")
_CODE_FENCE_RE = re.compile(r"\A```[\w-]*\s*\n(.*?)\n?\s*```\Z", re.DOTALL)
# A line that starts a call of its own: `name(`, `a.name(`, or `print(` around one.
_CALL_LINE_RE = re.compile(r"\s*(?:print\s*\(\s*)?[A-Za-z_][\w.]*\s*\(")


class ToolCallError(ValueError):
    """A call block that cannot become a `CropCall`; the message is meant for the model."""


@dataclass(frozen=True)
class CropCall:
    """One parsed `crop_video` call, times in seconds.

    `raw_video_path` is the model's text, untrusted: never open or join it (SPEC §2).
    """

    start_time: float
    end_time: float
    num_frames: int | None
    raw_video_path: str

    def arguments(self) -> dict[str, object]:
        """The call's arguments as plain JSON values (num_frames only when given)."""
        args: dict[str, object] = {
            "video_path": self.raw_video_path,
            "start_time": self.start_time,
            "end_time": self.end_time,
        }
        if self.num_frames is not None:
            args["num_frames"] = self.num_frames
        return args


@dataclass(frozen=True)
class ParsedBlock:
    """One call of a turn: exactly one of `call` and `error` is set.

    A `<tool_call>` block is one call; a `<tool_code>` block holding several calls, one per
    line, gives one `ParsedBlock` per call (module docstring).

    Attributes:
        index: position of the call among the turn's calls, from 0.
        kind: "json" for `<tool_call>`, "python" for `<tool_code>`.
        raw: the call as written, without the tags: the block body, or the call's lines
            when the block held several calls.
    """

    index: int
    kind: BlockKind
    call: CropCall | None
    error: str | None
    raw: str

    @property
    def ok(self) -> bool:
        return self.call is not None


@dataclass(frozen=True)
class CropValidation:
    """Result of `validate_crop_call`: the call with its end clamped, or an error."""

    call: CropCall | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.call is not None


def parse_tool_calls(text: str) -> list[ParsedBlock]:
    """Parse every call of the `<tool_call>` / `<tool_code>` blocks of `text`, in order (SPEC §2)."""
    calls: list[ParsedBlock] = []
    for match in _BLOCK_RE.finditer(text):
        kind = _KIND_OF_TAG[match.group(1)]
        body = match.group(2)
        if kind == "json":
            calls.append(_parsed_call(len(calls), kind, body, parse_json_call))
            continue
        try:
            call = parse_python_call(body)
        except ToolCallError as exc:
            lines = _call_lines(body)
            if len(lines) < 2:
                calls.append(ParsedBlock(len(calls), kind, None, str(exc), body))
                continue
            for line_number, source in lines:
                entry = _parsed_call(len(calls), kind, source, parse_python_call)
                if entry.error is not None:
                    entry = replace(entry, error=f"line {line_number} of the <tool_code> block: {entry.error}")
                calls.append(entry)
        else:
            calls.append(ParsedBlock(len(calls), kind, call, None, body))
    return calls


def _parsed_call(index: int, kind: BlockKind, source: str, parse: Callable[[str], CropCall]) -> ParsedBlock:
    try:
        return ParsedBlock(index, kind, parse(source), None, source)
    except ToolCallError as exc:
        return ParsedBlock(index, kind, None, str(exc), source)


def _call_lines(body: str) -> list[tuple[int, str]]:
    """The calls of a `<tool_code>` body written one per line, as (1-based line number of
    the call's first line in the body without its code fence, the call's source).

    A line that opens a call starts a new one once the current call has an opener; other
    lines (continuations, comments) belong to the call above; blank lines are dropped.
    """
    calls: list[tuple[int, list[str]]] = []
    opened = False
    for number, line in enumerate(_strip_code_fence(body.strip()).splitlines(), start=1):
        if not line.strip():
            continue
        starts_call = _CALL_LINE_RE.match(line) is not None
        if not calls or (starts_call and opened):
            calls.append((number, []))
            opened = False
        calls[-1][1].append(line)
        opened = opened or starts_call
    return [(number, "\n".join(lines).strip()) for number, lines in calls]


def parse_json_call(body: str) -> CropCall:
    """Parse a `<tool_call>` body: `{"name": "crop_video", "arguments": {...}}`.

    `arguments` may also be a JSON string holding that object (a common model habit).
    """
    payload = _load_json(body.strip(), "<tool_call>")
    if not isinstance(payload, dict):
        raise ToolCallError('<tool_call> must hold a JSON object {"name": ..., "arguments": {...}}')
    _check_tool_name(payload.get("name"))
    arguments = payload.get("arguments")
    if isinstance(arguments, str):
        arguments = _load_json(arguments, '"arguments"')
    if not isinstance(arguments, dict):
        raise ToolCallError('"arguments" must be a JSON object')
    return build_crop_call(arguments)


def parse_python_call(body: str) -> CropCall:
    """Parse a `<tool_code>` body holding one Python-style `crop_video(...)` call."""
    call = _unwrap_print(_parse_call_expression(_strip_code_fence(body.strip())))
    _check_tool_name(_called_name(call))
    return build_crop_call(_literal_arguments(call))


def build_crop_call(arguments: Mapping[str, object]) -> CropCall:
    """Check the argument names and values of a call and build the `CropCall`."""
    unknown = sorted(set(arguments) - set(ARGUMENT_ORDER))
    if unknown:
        raise ToolCallError(f"unknown argument(s) {', '.join(unknown)}; crop_video takes {', '.join(ARGUMENT_ORDER)}")
    missing = [name for name in REQUIRED_ARGUMENTS if name not in arguments]
    if missing:
        raise ToolCallError(f"missing required argument(s) {', '.join(missing)}")
    video_path = arguments["video_path"]
    if not isinstance(video_path, str):
        raise ToolCallError("video_path must be a string")
    return CropCall(
        start_time=parse_time(arguments["start_time"], "start_time"),
        end_time=parse_time(arguments["end_time"], "end_time"),
        num_frames=parse_frame_count(arguments.get("num_frames")),
        raw_video_path=video_path,
    )


def parse_time(value: object, name: str = "time") -> float:
    """A time in seconds from a number or a `SS`, `MM:SS` or `HH:MM:SS` string (SPEC §2).

    Seconds may be fractional (`01:02.5`); minutes may exceed 59 in the `MM:SS` form.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ToolCallError(f"{name} must be a number of seconds or an MM:SS / HH:MM:SS string")
    try:
        seconds = _seconds_from_text(value.strip(), name) if isinstance(value, str) else float(value)
    except OverflowError:
        raise ToolCallError(f"{name} is too large") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ToolCallError(f"{name} must be a finite, non-negative number of seconds, got {value!r}")
    return seconds


def parse_frame_count(value: object) -> int | None:
    """The optional frame count: None when absent, else a positive integer."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolCallError(f"num_frames must be a positive integer, got {value!r}")
    return value


def validate_crop_call(call: CropCall, duration: float) -> CropValidation:
    """Check a call against the video duration; clamp its end to the duration (SPEC §2).

    Valid when start < end and start < duration. Returns the clamped call, or an error
    message for the error tool response.
    """
    if call.start_time >= call.end_time:
        return CropValidation(
            None, f"start_time ({call.start_time:g} s) must be before end_time ({call.end_time:g} s)"
        )
    if call.start_time >= duration:
        return CropValidation(
            None, f"start_time ({call.start_time:g} s) is not before the end of the video ({duration:g} s)"
        )
    clamped = CropCall(call.start_time, min(call.end_time, duration), call.num_frames, call.raw_video_path)
    return CropValidation(clamped, None)


def _seconds_from_text(text: str, name: str) -> float:
    clock = _CLOCK_RE.match(text)
    if clock is None:
        try:
            return float(text)
        except ValueError:
            raise ToolCallError(f"{name} {text!r} is not seconds, MM:SS or HH:MM:SS") from None
    try:
        hours, minutes, seconds = int(clock["hours"] or 0), int(clock["minutes"]), float(clock["seconds"])
    except ValueError:  # more digits than int() converts
        raise ToolCallError(f"{name} {text[:40]!r}... is too long") from None
    if seconds >= 60 or (clock["hours"] is not None and minutes >= 60):
        raise ToolCallError(f"{name} {text!r}: minutes and seconds fields must be below 60")
    return 3600 * hours + 60 * minutes + seconds


def _load_json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"malformed JSON in {where}: {exc.msg} at character {exc.pos}") from None
    except (ValueError, RecursionError):  # a number too long to convert, or nesting too deep
        raise ToolCallError(f"malformed JSON in {where}: a number is too long or nesting too deep") from None


def _strip_code_fence(source: str) -> str:
    fenced = _CODE_FENCE_RE.match(source)
    return fenced.group(1).strip() if fenced else source


def _parse_call_expression(source: str) -> ast.Call:
    tree = _try_parse(source)
    if tree is None:
        tree = _try_parse(_STRAY_QUOTE_RE.sub(r"\1", source))
    if tree is None:
        raise ToolCallError(
            "<tool_code> is not a valid Python call such as "
            "crop_video(video_path=..., start_time=..., end_time=...)"
        )
    if not isinstance(tree.body, ast.Call):
        raise ToolCallError("<tool_code> must hold exactly one crop_video(...) call")
    return tree.body


def _try_parse(source: str) -> ast.Expression | None:
    try:
        return ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: NUL bytes
        return None


def _unwrap_print(call: ast.Call) -> ast.Call:
    is_print = isinstance(call.func, ast.Name) and call.func.id == "print"
    if is_print and len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Call):
        return call.args[0]
    return call


def _called_name(call: ast.Call) -> str | None:
    # `default_api.crop_video(...)` is the Gemini-style spelling the prior sometimes copies.
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _check_tool_name(name: object) -> None:
    if name != TOOL_NAME:
        raise ToolCallError(f"unknown tool {name!r}; the only tool is {TOOL_NAME}")


def _literal_arguments(call: ast.Call) -> dict[str, object]:
    if len(call.args) > len(ARGUMENT_ORDER):
        raise ToolCallError(f"crop_video takes at most {len(ARGUMENT_ORDER)} positional arguments")
    arguments: dict[str, object] = {}
    for name, node in zip(ARGUMENT_ORDER, call.args):
        arguments[name] = _literal_value(node, name)
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ToolCallError("**kwargs is not supported; name each argument")
        if keyword.arg in arguments:
            raise ToolCallError(f"argument {keyword.arg} given twice")
        arguments[keyword.arg] = _literal_value(keyword.value, keyword.arg)
    return arguments


def _literal_value(node: ast.expr, name: str) -> object:
    if isinstance(node, ast.Starred):
        raise ToolCallError("*args is not supported; pass each argument")
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ToolCallError(f"argument {name} must be a literal number or string") from None
