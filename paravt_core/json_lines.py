"""JSON-lines input for the stream commands (`paravt eval score`, `paravt rewards`).

A stream command answers every non-blank input line with one output line, whatever the
line holds, so that outputs stay aligned with inputs. Two things used to end the stream
early with a traceback instead (issue #48 item 4): a line nested so deep that `json.loads`
raises `RecursionError` (not a `ValueError`), and bytes that are not UTF-8, which a text
stdin raises from its `for` loop in a strict locale (`PYTHONIOENCODING=utf-8`), so no later
line was read. Reading the raw bytes and decoding each line on its own turns both into that
line's error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO


class BadLine(ValueError):
    """An input line that is not a JSON value; the message says what is wrong with it."""


def raw_lines(stream: IO[str]) -> Iterable[bytes | str]:
    """The lines of `stream`, undecoded when it has a byte buffer (a real stdin); a text stream
    without one (`io.StringIO` in tests) gives its lines as they are."""
    return getattr(stream, "buffer", stream)


def is_blank(line: bytes | str) -> bool:
    return not line.strip()


def load_json_line(line: bytes | str) -> object:
    """One input line as a JSON value; `BadLine` (what is wrong, on one line) for anything else."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadLine(f"not UTF-8 text (byte {err.start + 1} is {line[err.start]:#04x}); write the line as "
                          "UTF-8") from None
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise BadLine(f"not valid JSON ({err.msg} at character {err.pos})") from None
    except RecursionError:
        raise BadLine("not valid JSON for this command: nesting too deep to read (an input record is one "
                      "flat object)") from None
    except ValueError:  # an integer past Python's digit limit for str -> int (4300 digits)
        raise BadLine("not valid JSON for this command: a number is too long to read") from None
