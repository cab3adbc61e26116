"""`validate`: check one table of rows against its data contract (a GX expectation suite).

The steps: read the table (`tables`), add the derived row id where the format has none,
build the suite for its kind (`suites`), validate it in the process's GX context
(`runtime`), write the validation JSON and Data Docs page into report_dir and collect the
failures (`report`). Then, by `on_bad_rows`:

- "fail": any failure raises `ContractError` with the failure table.
- "quarantine": bad rows go to `<name>.quarantine.<ext>` and good ones to
  `<name>.kept.<ext>` in report_dir (atomic writes; `<name>` is `<suite>.<table stem>`, so
  shards of one report_dir do not collide); the result's `kept_path` is the table to go on
  with. A table-level failure (a missing column, no rows) or a table with no good row
  still raises: there is nothing sound to continue with.

Great Expectations is imported on first use, so importing `data_contracts` stays cheap.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from data_contracts.result import ContractError, ContractResult

log = logging.getLogger(__name__)

ON_BAD_ROWS = ("fail", "quarantine")


def _check_arguments(kind: str, split: str | None, on_bad_rows: str, media_dirs: tuple,
                     media_root: Path | None = None) -> None:
    from data_contracts.suites import EVAL_SPLITS, KINDS

    if kind not in KINDS:
        raise ValueError(f"unknown contract kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "eval" and split not in EVAL_SPLITS:
        raise ValueError(f"eval contracts need split= one of {', '.join(EVAL_SPLITS)}, got {split!r}")
    if kind != "eval" and (split is not None or any(d is not None for d in media_dirs)):
        raise ValueError(f"split, video_dir and subtitle_dir apply to eval tables only, not {kind!r}")
    if kind == "eval" and media_root is not None:
        raise ValueError("media_root applies to sft and rl tables; eval tables take video_dir")
    if on_bad_rows not in ON_BAD_ROWS:
        raise ValueError(f"on_bad_rows must be one of {', '.join(ON_BAD_ROWS)}, got {on_bad_rows!r}")


def _read(table_path: Path):
    from data_contracts.tables import TableError, read_table

    try:
        return read_table(table_path)
    except TableError as error:
        raise ContractError(f"cannot check the data contract of {table_path}: {error}") from error


def _message(result: ContractResult, table_path: Path, ending: str) -> str:
    from data_contracts.report import failure_table

    table_level = [f for f in result.failures if f.row is None]
    what = f"{result.n_bad} of {result.n_rows} rows break it"
    if table_level:
        what += f", plus {len(table_level)} table-level failure(s)"
    return (
        f"data contract {result.suite} failed for {table_path}: {what}\n"
        f"{failure_table(result.failures)}\n"
        f"GX validation result: {result.validation_json}\n"
        f"Data Docs page: {result.docs_html}\n"
        f"{ending}"
    )


def _quarantine(table, bad_rows: set[int], stem: str, report_dir: Path) -> tuple[Path, Path]:
    """Write the good rows to `<stem>.kept<ext>` and the bad ones to `<stem>.quarantine<ext>`."""
    rows = list(table.frame.index)
    good = [position for position, row in enumerate(rows) if row not in bad_rows]
    bad = [position for position, row in enumerate(rows) if row in bad_rows]
    suffix = table.path.suffix
    quarantine_path = table.write_rows(bad, report_dir / f"{stem}.quarantine{suffix}")
    kept_path = table.write_rows(good, report_dir / f"{stem}.kept{suffix}")
    return kept_path, quarantine_path


def _settle(table, result: ContractResult, on_bad_rows: str, report_dir: Path, stem: str) -> ContractResult:
    """Pass, raise, or quarantine the bad rows, as `on_bad_rows` says (module docstring)."""
    if result.passed:
        return replace(result, kept_path=table.path)
    table_level = any(f.row is None for f in result.failures)
    if on_bad_rows == "fail":
        raise ContractError(_message(result, table.path, 'Fix these rows, or pass on_bad_rows="quarantine".'), result)
    if table_level or result.n_bad == result.n_rows:
        ending = "Quarantine cannot help: " + ("a table-level rule failed." if table_level else "no row is good.")
        raise ContractError(_message(result, table.path, ending), result)
    bad_rows = {f.row for f in result.failures}
    kept_path, quarantine_path = _quarantine(table, bad_rows, stem, report_dir)
    log.warning(
        "data contract %s: quarantined %d of %d rows of %s to %s; continuing with %d rows from %s",
        result.suite, result.n_bad, result.n_rows, table.path, quarantine_path,
        result.n_rows - result.n_bad, kept_path,
    )
    return replace(result, kept_path=kept_path, quarantine_path=quarantine_path)


def _probe_videos(frame, kind: str, split: str | None, video_dir: Path | None, media_root: Path | None,
                  media_health: Path, workers: int | None, progress: bool) -> None:
    """Probe every video the media-health rule will ask about, `workers` processes at a time
    (`MediaHealthCache.check_all`), before the suite runs: the rule asks one cell at a time and
    now finds each verdict made. The rule itself decides, so the verdicts and the order of the
    failures are those of a serial run; the same filters choose the files (nothing outside
    the media root is read)."""
    from paravt_core.video.health import health_cache

    from data_contracts import rules, suites

    paths: list[Path] = []
    if kind == "eval":
        if video_dir is None:
            return
        columns = [c for c in sorted(suites.row_format(kind, split, frame.columns).columns) if c in frame.columns]
        for row in frame[columns].to_dict("records"):
            try:
                path = rules.eval_health_path(row, split, str(video_dir))
            except Exception:  # noqa: BLE001 - the rule reports what it cannot read; this only warms the cache
                continue
            paths += [path] if path is not None else []
    elif "videos" in frame.columns:
        root = str(media_root) if media_root is not None else None
        for value in frame["videos"].tolist():
            try:
                paths += rules.health_paths(value, root)
            except Exception:  # noqa: BLE001 - as above
                continue
    if paths:
        health_cache(str(media_health)).check_all(paths, workers=workers, progress=progress)


def validate(
    kind: str,
    table_path: Path,
    *,
    split: str | None = None,
    on_bad_rows: str = "fail",
    report_dir: Path,
    video_dir: Path | None = None,
    subtitle_dir: Path | None = None,
    media_root: Path | None = None,
    media_health: Path | None = None,
    probe_workers: int | None = 1,
    progress: bool = False,
) -> ContractResult:
    """Check every row of a table against its data contract.

    Args:
        kind: "sft" or "rl" (ParaVT-Parquet rows after materialize, SPEC §8) or "eval".
        table_path: the rows (.parquet, .jsonl or .json list).
        split: for eval, one of the seven SPEC §7 splits.
        on_bad_rows: "fail" raises `ContractError`; "quarantine" sets bad rows aside.
        report_dir: where the GX validation JSON, the Data Docs page and any kept /
            quarantined rows are written (created if absent).
        video_dir: for eval, the folder the split's loader resolves videos under; None
            skips the existence rule (e.g. annotation-only fixtures).
        subtitle_dir: for videomme_wsub, where `<videoID>.srt` files are (default video_dir).
        media_root: for sft and rl, the folder every referenced media file must lie in
            (the unpacked ParaVT-Source); None skips that rule.
        media_health: a folder caching video probes by content hash; given, every video
            (SFT / RL `videos`, an eval row's video) must decode, with frames and a
            duration. None skips the probes.
        probe_workers: processes probing those videos before the rules ask for them (None:
            one per CPU; 1: the rule probes each when it gets to it). Same verdicts either way.
        progress: show the probes' progress bar.

    Returns:
        The `ContractResult`; with bad rows in quarantine mode, `kept_path` is the table
        to continue with.

    Raises:
        ContractError: the contract failed (see `on_bad_rows`), or the table is unreadable.
        ValueError: bad arguments.
    """
    from data_contracts import report, rules, runtime, suites, tables

    _check_arguments(kind, split, on_bad_rows, (video_dir, subtitle_dir), media_root)
    table_path, report_dir = Path(table_path), Path(report_dir)
    table = _read(table_path)
    frame = table.frame
    if kind == "sft" and "messages" in frame.columns:
        frame = frame.assign(messages=frame["messages"].map(rules.decoded_messages))
    fmt = suites.row_format(kind, split, frame.columns)
    frame = tables.with_row_ids(frame, fmt.identity, suites.ROW_ID)
    if media_health is not None and probe_workers != 1:
        _probe_videos(frame, kind, split, video_dir, media_root, media_health, probe_workers, progress)
    runtime.batch_definition()  # GX suites need the context to exist first
    suite = suites.build_suite(kind, split, list(frame.columns), video_dir, subtitle_dir, media_root, media_health)
    gx_result = runtime.run_suite(frame, suite)
    stem = f"{suite.name}.{table_path.stem}"
    paths = {
        "validation_json": report.write_validation_json(gx_result, report_dir / f"{stem}.validation.json"),
        "docs_html": report.write_data_docs(gx_result, report_dir / f"{stem}.html"),
    }
    failures = report.collect_failures(gx_result, frame, table_path)
    result = ContractResult(
        passed=not failures,
        n_rows=len(frame),
        n_bad=len({f.row for f in failures if f.row is not None}),
        kept_path=None,
        quarantine_path=None,
        failures=failures,
        suite=suite.name,
        **paths,
    )
    return _settle(table, result, on_bad_rows, report_dir, stem)
