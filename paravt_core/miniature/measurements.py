"""What the miniature reproduction measured (#15): the records `paravt reproduce` keeps in
`runs.json` and `budget.json`, checked when read back, and the readers that gather them from a
run's files.

- `ModelRun`: one trained model (the SFT model, or one seed of an RL row) and what was measured
  on it; `BudgetPoint`: the SFT model at one overview budget K;
- `runs_from_json`, `budget_from_json`: the files read back, every value checked
  (`MeasurementsError` names the file, the entry and the field); `check_distinct`: no run twice;
- `read_steps`, `group_breakdown`, `held_out_groups`: an RL run's per-step metrics and the
  held-out accuracy per question group, from the run's and the evaluation's files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

from paravt_core.dist.weights import MODEL_META

LAST_STEPS = 3


# What runs.json / budget.json may hold, checked when they are read back (#48 item 6): a NaN,
# a string or an accuracy above 1 would otherwise print as a table cell such as "nan ± nan".
# Strict: a number written as a string is an error, not a value. Per-step training metrics are
# kept as logged (a NaN or inf there is a measurement of a diverged step, shown as such), but a
# finite one beyond STEP_BOUND is no measurement (1e308 overflowed the report's sums, #61 item 3).
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
MEASUREMENTS = ConfigDict(strict=True, extra="forbid")
STEP_BOUND = 1e12


def _row_name(name: str) -> str:
    if not name.strip() or name != name.strip():
        raise ValueError(f"{name!r} is not a row name: give sft or an RL row (conf/rl/<row>.yaml)")
    return name


def _step_value(value: int | float) -> int | float:
    # an int as large as 10**400 is compared exactly (math.isfinite would overflow on it)
    if (isinstance(value, int) or math.isfinite(value)) and abs(value) > STEP_BOUND:
        small = isinstance(value, float) or abs(value) < 1e300
        shown = f"{float(value):.3g}" if small else f"an integer of {len(str(abs(value)))} digits"
        raise ValueError(f"{shown} is beyond ±{STEP_BOUND:g}: not a measurement of a step")
    return value


def _step_records(steps: list[dict]) -> list[dict]:
    seen = set()
    for i, record in enumerate(steps):
        step = record.get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step record [{i}] has no whole, non-negative 'step' (got {step!r})")
        if step in seen:
            raise ValueError(f"step record [{i}] repeats step {step}")
        seen.add(step)
    return steps


StepRecord = dict[str, Annotated[int | float, AfterValidator(_step_value)]]


class GroupMeasure(TypedDict):
    """One question group's held-out measurements of a run (`group_breakdown`)."""

    __pydantic_config__ = MEASUREMENTS  # type: ignore[misc]

    n: Annotated[int, Field(ge=1)]
    accuracy: Fraction
    tool_calls: NonNegative


class HostNumerics(TypedDict):
    """What, beyond the config, the inputs and the code, decided a model's float results, as its
    export recorded it (`provenance.host_numerics`, under "numerics" in its `paravt_meta.json`):
    rank 0's torch threads, the host's cores (None where the OS did not say), the CPU kernels
    torch chose, torch's version, the CPU (not in records from before 2026-12-01) and, for a
    model trained on a CUDA device, the card with its CUDA and cuDNN (`accelerator`; a record
    with the CPU and no accelerator was trained on the CPU)."""

    __pydantic_config__ = MEASUREMENTS  # type: ignore[misc]

    torch_threads: Annotated[int, Field(ge=1)]
    host_cpus: Annotated[int, Field(ge=1)] | None
    cpu_capability: str
    torch: str
    cpu: NotRequired[str]
    accelerator: NotRequired[str]


@dataclass(frozen=True)
class ModelRun:
    """One trained model of the reproduction and what was measured on it.

    Attributes:
        row: "sft" or an RL row name (conf/rl/<row>.yaml).
        seed: the RL run's `run.seed` (None for the SFT model).
        accuracy: held-out accuracy in `subagent` tool mode (fraction).
        accuracy_direct: the same questions in `direct` mode (no tools).
        eval_tool_calls: mean executed crop calls per held-out question (subagent mode).
        steps: the RL run's per-step metrics (its metrics.jsonl rows); empty for SFT.
        answer_tag_rate: held-out answers (subagent mode) with a closed, non-blank `<answer>`
            block (the evaluation summary's `answer_tag_rate`); None where not measured.
        by_group: held-out accuracy and crop calls (subagent mode) per question group
            (`group_breakdown`: e.g. the generated world's first and second wordings); empty
            where the held-out questions form one group.
        accuracy_val, accuracy_direct_val: the same on the validation split (`videomme_val`,
            where knobs are chosen); None where the world draws none or it was not measured.
        correct: per held-out (test) question id, whether the subagent-mode answer was right:
            kept with the measurements (the verdicts compare each run's `accuracy`, its mean);
            empty in runs from before it.
        gating_draw_key: the RL run's `rl.gating.draw_key` (None for SFT).
        probe_calls, probe_format: per question of the held-out probe (sampled at τ = 0.7 at a
            fixed K), crop calls per episode and the share of episodes whose answer is in
            format: what the κ and format verdicts compare (`verdicts`); empty where not measured.
        sft_build: which SFT model the run is (the SFT row) or started from (RL rows), e.g. its
            content key; None: the one SFT model of the report. The verdicts take the SFT build as
            a level (`miniature.verdicts`).
        numerics: the host numerics the model was trained under (`model_numerics`); None where
            its export did not record them (RL exports and runs.json files from before the record).
    """

    __pydantic_config__ = MEASUREMENTS

    row: Annotated[str, AfterValidator(_row_name)]
    seed: int | None
    accuracy: Fraction
    accuracy_direct: Fraction
    eval_tool_calls: NonNegative
    steps: Annotated[list[StepRecord], AfterValidator(_step_records)] = field(default_factory=list)
    answer_tag_rate: Fraction | None = None
    by_group: dict[str, GroupMeasure] = field(default_factory=dict)
    accuracy_val: Fraction | None = None
    accuracy_direct_val: Fraction | None = None
    correct: dict[str, bool] = field(default_factory=dict)
    gating_draw_key: int | None = None
    probe_calls: dict[str, NonNegative] = field(default_factory=dict)
    probe_format: dict[str, Fraction] = field(default_factory=dict)
    sft_build: str | None = None
    numerics: HostNumerics | None = None

    def final(self, metric: str) -> float | None:
        values = [s[metric] for s in sorted(self.steps, key=lambda s: s["step"]) if metric in s][-LAST_STEPS:]
        return sum(values) / len(values) if values else None

    def first(self, metric: str) -> float | None:
        ordered = sorted(self.steps, key=lambda s: s["step"])
        return ordered[0].get(metric) if ordered else None


@dataclass(frozen=True)
class BudgetPoint:
    """The SFT model on the validation split with an overview of `k` frames (#35 item 2).

    Attributes:
        k: the overview budget (eval.nframes).
        accuracy, accuracy_direct: accuracy in subagent tool mode and in direct mode.
        eval_tool_calls: mean crop calls per question (subagent mode).
        visible: share of the split's videos whose event lies on one of the K overview frames
            (`miniature.visibility`).
        n: the split's videos.
    """

    __pydantic_config__ = MEASUREMENTS

    k: Annotated[int, Field(ge=1)]
    accuracy: Fraction
    accuracy_direct: Fraction
    eval_tool_calls: NonNegative
    visible: Fraction
    n: Annotated[int, Field(ge=1)]


def read_steps(rl_model_dir: Path) -> list[dict[str, float]]:
    """The per-step metrics an RL run wrote beside its exported model (`<run>/metrics.jsonl`)."""
    path = Path(rl_model_dir).parent / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the RL run left no per-step metrics; re-run its rl task")
    by_step = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[int(row["step"])] = row  # a resumed run may repeat a step: keep the last
    return [by_step[k] for k in sorted(by_step)]


_NUMERICS = TypeAdapter(HostNumerics)


def model_numerics(model_dir: Path) -> HostNumerics | None:
    """The host numerics an exported model recorded (its `paravt_meta.json` "numerics"); None
    where the folder has no such file or the export predates the record.

    Raises:
        MeasurementsError: the file is not JSON, or its record is not `HostNumerics` (naming the file).
    """
    path = Path(model_dir) / MODEL_META
    if not path.is_file():
        return None
    try:
        recorded = json.loads(path.read_text()).get("numerics")
    except (OSError, ValueError, AttributeError) as error:
        raise MeasurementsError(f"{path}: cannot read the export's metadata ({error}); train the model again "
                                "or restore the file") from None
    if recorded is None:
        return None
    try:
        return _NUMERICS.validate_python(recorded)
    except ValidationError as error:
        raise MeasurementsError(f"{path}: its \"numerics\" are not what `provenance.host_numerics` writes: "
                                f"{error.errors()[0]['loc']} {error.errors()[0]['msg']}") from None


def group_breakdown(records: Iterable[Mapping], group_of: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """`{group: {"n", "accuracy", "tool_calls"}}` over evaluation records (`<split>.jsonl` rows:
    "id", "correct", "tool_calls"), each put in `group_of[id]`. Empty when the questions form
    fewer than two groups. A record whose id has no group is an error: the records and the
    questions must come from the same split."""
    totals: dict[str, list[float]] = {}
    for record in records:
        if record["id"] not in group_of:
            raise KeyError(f"evaluation record {record['id']!r} is not among the split's questions")
        total = totals.setdefault(group_of[record["id"]], [0, 0.0, 0.0])
        total[0] += 1
        total[1] += bool(record["correct"])
        total[2] += record["tool_calls"]
    if len(totals) < 2:
        return {}
    return {group: {"n": n, "accuracy": correct / n, "tool_calls": calls / n}
            for group, (n, correct, calls) in sorted(totals.items())}


# How every second-wording question of the generated world ends (`data.synth.questions.
# second_wording_text`); no first-wording template does (tests/unit/test_synth_second_wording.py).
SECOND_WORDING_TAIL = " in this video?"


def wording_of(text: str) -> int:
    """1 when a generated question is in the second wording (`SynthConfig.second_wording`), else 0."""
    return int(text.endswith(SECOND_WORDING_TAIL))


def held_out_groups(split_dir: Path) -> dict[str, str]:
    """`question_id -> "first wording" | "second wording"` for the Video-MME-format rows of
    `split_dir` (its parquet files; `wording_of` tells the wording)."""
    import pyarrow.parquet as pq

    files = sorted(split_dir.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no parquet rows in {split_dir}; materialize the evaluation data first")
    groups = {}
    for path in files:
        for row in pq.read_table(path, columns=["question_id", "question"]).to_pylist():
            groups[row["question_id"]] = ("second" if wording_of(row["question"]) else "first") + " wording"
    return groups


class MeasurementsError(ValueError):
    """A runs.json or budget.json that is not what `write_report` writes; the message names the
    file, the entry and the field."""


def _validated(adapter: TypeAdapter, data: str | bytes, source: str) -> list:
    try:
        return adapter.validate_json(data)
    except ValidationError as error:
        problems = []
        for e in error.errors()[:3]:
            # the JSON path of the value, e.g. [2].accuracy: the third run's accuracy
            where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in e["loc"]) or "the file"
            got = "" if e["type"] == "json_invalid" else f" (got {json.dumps(e.get('input'), default=str)[:40]})"
            problems.append(f"{where}: {e['msg']}{got}")
        more = f"; and {error.error_count() - 3} more" if error.error_count() > 3 else ""
        raise MeasurementsError(f"{source}: not a measurements file as `paravt reproduce` writes it: "
                                f"{'; '.join(problems)}{more}. Restore it from the run's MLflow artifacts "
                                "(`paravt miniature report --experiment`) or run `paravt reproduce` again") from None


_RUNS = TypeAdapter(list[ModelRun])
_BUDGET = TypeAdapter(list[BudgetPoint])


def runs_from_json(text: str | bytes, source: str = "runs.json") -> list[ModelRun]:
    """The runs of a runs.json, checked (`MeasurementsError` names `source`, the run and the field)."""
    runs = _validated(_RUNS, text, source)
    if not runs:
        raise MeasurementsError(f"{source}: holds no runs, so there is nothing to report; give the report folder "
                                "of a finished `paravt reproduce`")
    check_distinct(runs, source)
    return runs


def check_distinct(runs: Sequence[ModelRun], source: str) -> None:
    """Each run listed once and one SFT model per SFT build (#61 item 3: a run listed twice was
    counted as two seeds and narrowed the interval from ±12.7 to ±2.9).

    Raises:
        MeasurementsError: naming both entries.
    """
    first: dict[tuple, int] = {}
    for i, r in enumerate(runs):
        # an SFT build has one SFT model whatever its seed; an RL run is its row, seed, draw key and build
        key = ("sft", r.sft_build) if r.row == "sft" else (r.row, r.seed, r.gating_draw_key, r.sft_build)
        if key in first:
            what = (f"a second SFT model of {'the report' if r.sft_build is None else f'SFT build {r.sft_build!r}'}"
                    if r.row == "sft" else f"the same run ({r.row}, seed {r.seed}, draw key {r.gating_draw_key}"
                                           f"{'' if r.sft_build is None else f', SFT build {r.sft_build!r}'})")
            raise MeasurementsError(f"{source}: [{i}] is {what} as [{first[key]}]; a run listed twice would be "
                                    "counted twice: remove one, or restore the file from the run's MLflow artifacts")
        first[key] = i


def budget_from_json(text: str | bytes, source: str = "budget.json") -> list[BudgetPoint]:
    """The budget sweep of a budget.json ([] when it measured none), checked like `runs_from_json`."""
    return _validated(_BUDGET, text, source)
