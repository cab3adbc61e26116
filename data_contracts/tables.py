"""Tables of rows as GX sees them, and subsets written back in the table's own format.

A table is read into a pandas frame of object columns holding plain Python values (lists
and dicts, from pyarrow's `to_pylist` or JSON), indexed by row number as
`paravt_core.eval.samples` counts rows: 1-based, and the line number for `.jsonl`. Object
columns keep integers integers even next to nulls, which pandas' own readers do not.

Kept and quarantined rows are written in the input's format: parquet rows are taken from
the Arrow table (same schema), JSON Lines rows are the original lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from paravt_core.atomic import atomic_write_bytes

SUFFIXES = (".parquet", ".jsonl", ".json")


class TableError(ValueError):
    """A table that cannot be read as rows at all (names the file and, if known, the line)."""


@dataclass(frozen=True)
class Table:
    """The rows of one file: `frame` (index = row numbers) and a writer for row subsets."""

    path: Path
    frame: pd.DataFrame
    subset_bytes: Callable[[Sequence[int]], bytes]  # row positions -> bytes in the input's format

    def write_rows(self, positions: Sequence[int], out: Path) -> Path:
        """Write the rows at these positions (0-based, in order) to `out`, atomically."""
        return atomic_write_bytes(out, self.subset_bytes(list(positions)))


def object_frame(records: Sequence[dict[str, Any]], columns: Sequence[str], row_numbers: Sequence[int]) -> pd.DataFrame:
    """A frame of object columns (absent keys are None), indexed by row number."""
    index = pd.Index(list(row_numbers))
    data = {name: pd.Series([r.get(name) for r in records], index=index, dtype=object) for name in columns}
    return pd.DataFrame(data, index=index)


def _parquet_table(path: Path) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        arrow = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise TableError(f"{path}: not a readable parquet file ({error})") from error
    index = pd.Index(range(1, arrow.num_rows + 1))
    data = {name: pd.Series(arrow.column(name).to_pylist(), index=index, dtype=object) for name in arrow.column_names}

    def subset(positions: Sequence[int]) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(arrow.take(pa.array(positions, type=pa.int64())), sink, compression="zstd")
        return sink.getvalue().to_pybytes()

    return Table(path, pd.DataFrame(data, index=index), subset)


def _columns_of(records: Iterable[dict[str, Any]]) -> list[str]:
    """Every key of the records, in order of first appearance."""
    return list(dict.fromkeys(key for record in records for key in record))


def _jsonl_table(path: Path) -> Table:
    lines, records, numbers = [], [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TableError(f"{path}: line {number} is not valid JSON ({error})") from error
        if not isinstance(record, dict):
            raise TableError(f"{path}: line {number} is not a JSON object")
        lines.append(line)
        records.append(record)
        numbers.append(number)
    frame = object_frame(records, _columns_of(records), numbers)
    return Table(path, frame, lambda positions: "".join(lines[p] + "\n" for p in positions).encode("utf-8"))


def _json_table(path: Path) -> Table:
    records = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise TableError(f"{path}: expected a JSON list of row objects")
    frame = object_frame(records, _columns_of(records), range(1, len(records) + 1))
    return Table(
        path, frame, lambda positions: json.dumps([records[p] for p in positions], ensure_ascii=False).encode("utf-8")
    )


def read_table(path: Path) -> Table:
    """A `.parquet`, `.jsonl` or `.json` (list of objects) table of rows."""
    path = Path(path)
    readers = {".parquet": _parquet_table, ".jsonl": _jsonl_table, ".json": _json_table}
    if path.suffix not in readers:
        raise TableError(f"{path}: unsupported table format; use one of {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise TableError(f"{path}: table not found")
    return readers[path.suffix](path)


def _plain(value: Any) -> Any:
    """JSON fallback for numpy arrays and scalars."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def row_sha256(values: Sequence[Any]) -> str:
    """sha256 of the canonical JSON (sorted keys) of a row's identity values."""
    canonical = json.dumps(list(values), sort_keys=True, ensure_ascii=False, default=_plain, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def with_row_ids(frame: pd.DataFrame, identity: Sequence[str], id_column: str) -> pd.DataFrame:
    """The frame plus `id_column` hashing the `identity` columns, when all of them exist."""
    if not identity or not set(identity) <= set(frame.columns):
        return frame
    ids = [row_sha256(values) for values in frame[list(identity)].itertuples(index=False, name=None)]
    return frame.assign(**{id_column: pd.Series(ids, index=frame.index, dtype=object)})
