"""What a pipeline run set aside instead of stopping, gathered for its final summary.

One bad file never ends a run (issue #12), so it must not vanish either: the summary
names every file that was left out, with the stage that left it out.

- data contract: rows quarantined under `data.on_bad_rows: quarantine`
  (`paravt_core.data.stage.SetAside`, one entry per table and reason);
- SFT: samples skipped at run time because their video did not decode (the model's
  `paravt_meta.json` "media_skipped", row source -> error);
- SFT grammar check: held-out samples left out because their video did not decode;
- eval: samples whose video did not decode, scored 0 (each split summary's "errors").

Each entry's `why` is the message of the check that caught it, which names the file.
RL's run-time drops are only in its stage log (warnings naming the video).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from paravt_core.atomic import atomic_write_text
from paravt_core.data.stage import SetAside
from paravt_core.dist.weights import MODEL_META
from paravt_core.eval.report import EvalReport


@dataclass(frozen=True)
class SetAsideEntry:
    """One thing a stage left out: `stage` says which and how, `where` which rows or sample."""

    stage: str
    where: str
    why: str


def _rows(rows: Sequence[int]) -> str:
    shown = ", ".join(str(row) for row in rows[:8])
    return f"row {shown}" if len(rows) == 1 else f"rows {shown}" + (f" (+{len(rows) - 8})" if len(rows) > 8 else "")


def from_data_contracts(quarantined: Sequence[SetAside]) -> list[SetAsideEntry]:
    return [SetAsideEntry(f"data contract {q.kind} (quarantined)", f"{q.table.name} {_rows(q.rows)}", q.problem)
            for q in quarantined]


def from_sft_model(model_dir: Path) -> list[SetAsideEntry]:
    """The SFT samples the exported model was trained without (their video did not decode)."""
    meta = json.loads((Path(model_dir) / MODEL_META).read_text())
    skipped: Mapping[str, str] = meta.get("media_skipped") or {}
    return [SetAsideEntry("SFT (sample skipped)", source, problem) for source, problem in skipped.items()]


def from_grammar_check(result: Mapping[str, object]) -> list[SetAsideEntry]:
    """Held-out samples the SFT grammar check left out (their video did not decode)."""
    return [SetAsideEntry("SFT grammar check (sample left out)", f"sample {sample_id}", why)
            for sample_id, why in result.get("set_aside", [])]


def from_eval_reports(reports: Mapping[str, EvalReport]) -> list[SetAsideEntry]:
    return [SetAsideEntry(f"eval {label}/{split} (scored 0)", f"sample {error['id']}", error["error"])
            for label, report in reports.items() for split, summary in report.summaries.items()
            for error in summary.get("errors", [])]


def format_set_aside(entries: Sequence[SetAsideEntry]) -> str:
    """One line per entry: stage, where, why (the why names the file)."""
    if not entries:
        return "nothing (every row and sample was used)"
    return "\n".join(f"{entry.stage}: {entry.where}: {entry.why}" for entry in entries)


def write_set_aside(path: Path, entries: Sequence[SetAsideEntry]) -> Path:
    """`<output_dir>/set_aside.json`: the entries as a JSON list, atomically."""
    return atomic_write_text(path, json.dumps([asdict(entry) for entry in entries], indent=1) + "\n")
