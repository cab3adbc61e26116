"""The miniature reproduction's report (#15): Table 2 in miniature, with intervals over seeds.

`paravt reproduce` trains one SFT model, then each RL row of SPEC §6 from it once per seed,
and evaluates every model on the held-out questions twice: in `subagent` tool mode (the
agent may crop, sub-agents summarize) and in `direct` mode (no tools, the same overview).
This module turns those measurements into

- `table_markdown`: one line per row: held-out accuracy in both modes, the tool gain
  (subagent minus direct), the gain over SFT, κ of the held-out evaluation, and fτ_fixed / κ
  of training (the mean of the last `LAST_STEPS` RL steps, as `paravt report` does; SPEC §5:
  fτ under one fixed definition for every row; also over the transcript, forced think
  prefixes included, which runs before that metric existed leave "–": see
  `rl.policy.fixed_format_reward`). Each cell is the mean over seeds with its
  95 % t-interval. The SFT row's training fτ / κ are those of the first RL step's rollouts
  (the SFT policy before any update). The last column is the share of held-out answers in the
  format asked for (a closed `<answer>` block with a body, SPEC §4.3), where the paper's
  format claims show on the evaluation rather than on sampled training text;
- `findings`: the issue's checks, computed (tools necessary, RL learns, the κ / fτ contrast);
- `verdicts`: one line per finding of SPEC §6, each comparison labelled from tests on run
  means (the SFT build a level) against minimum effects and Holm families fixed in code
  (`verdicts.py`, `inference.py`), and the runs that fell as their own outcome;
- `plot_steps`: fτ_fixed, κ and the rollouts' accuracy per RL step for all rows in one figure
  (mean over seeds, min-max band).

Everything but `write_report` is a pure function of the measurements.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from paravt_core.miniature import verdicts as judged

LAST_STEPS = 3
STEP_METRICS = (("f_tau_fixed", "fτ (fixed R_fmt, τ = 0.7)"), ("kappa", "κ (tool calls per rollout)"),
                ("reward_acc", "accuracy of the rollouts (R_acc)"))

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


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def cell(self, scale: float = 1.0, digits: int = 1) -> str:
        if self.n < 2:
            return f"{scale * self.mean:.{digits}f}"
        half = scale * (self.high - self.mean)
        return f"{scale * self.mean:.{digits}f} ± {half:.{digits}f}"


def interval95(values: Sequence[float]) -> Interval | None:
    """Mean and two-sided 95 % Student t interval of `values` (None when there are none)."""
    values = [float(v) for v in values]
    if not values:
        return None
    n, mean = len(values), sum(values) / len(values)
    if n == 1:
        return Interval(mean, mean, mean, 1)
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


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


def group_table_markdown(runs: Sequence[ModelRun]) -> str:
    """Held-out accuracy (%) and crop calls per question per group, one line per row (mean over
    seeds ± the 95 % half width); "" when no run has groups."""
    groups = sorted({g for r in runs for g in r.by_group})
    if not groups:
        return ""
    head = "| row | seeds | " + " | ".join(f"{g}: accuracy (%) | {g}: κ" for g in groups) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(groups))]
    for row in rows_in_order(runs):
        mine = [r for r in _by_row(runs, row) if r.by_group]
        if not mine:
            continue
        cells = [str(len(mine))]
        for g in groups:
            cells.append(_cell(interval95([r.by_group[g]["accuracy"] for r in mine if g in r.by_group]), 100))
            cells.append(_cell(interval95([r.by_group[g]["tool_calls"] for r in mine if g in r.by_group]), 1, 2))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    n = {g: sorted({int(r.by_group[g]["n"]) for r in runs if g in r.by_group}) for g in groups}
    sizes = ", ".join(f"{g} {'/'.join(map(str, n[g]))}" for g in groups)
    return "\n".join(lines) + f"\n\nQuestions per group: {sizes}."


def rows_in_order(runs: Sequence[ModelRun]) -> list[str]:
    return list(dict.fromkeys(r.row for r in runs))


def _by_row(runs: Sequence[ModelRun], row: str) -> list[ModelRun]:
    return [r for r in runs if r.row == row]


def _cell(interval: Interval | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if interval is None else interval.cell(scale, digits)


def sft_training_start(runs: Sequence[ModelRun], prefer: str = "paragrpo") -> list[ModelRun]:
    """The RL runs whose first step stands for the SFT policy's training-time fτ / κ."""
    rl_rows = [row for row in rows_in_order(runs) if row != "sft"]
    chosen = prefer if prefer in rl_rows else (rl_rows[0] if rl_rows else None)
    return _by_row(runs, chosen) if chosen else []


def table_markdown(runs: Sequence[ModelRun]) -> str:
    """Table 2 in miniature (see the module docstring); percentages for accuracies."""
    sft = _by_row(runs, "sft")
    sft_accuracy = sft[0].accuracy if sft else None
    head = ("| row | seeds | accuracy, subagent mode (%) | accuracy, direct mode (%) | tool gain (points) | "
            "gain over SFT (points) | held-out κ | training fτ_fixed | training κ | training fτ_fixed, transcript | "
            "held-out answers in format (%) | probe κ, sampled | probe format, sampled |")
    lines = [head, "|" + "---|" * 13]
    for row in rows_in_order(runs):
        mine = _by_row(runs, row)
        if row == "sft":
            start = sft_training_start(runs)
            f_tau = interval95([v for r in start if (v := r.first("f_tau_fixed")) is not None])
            kappa = interval95([v for r in start if (v := r.first("kappa")) is not None])
            f_tau_t = interval95([v for r in start if (v := r.first("f_tau_fixed_transcript")) is not None])
        else:
            f_tau = interval95([v for r in mine if (v := r.final("f_tau_fixed")) is not None])
            kappa = interval95([v for r in mine if (v := r.final("kappa")) is not None])
            f_tau_t = interval95([v for r in mine if (v := r.final("f_tau_fixed_transcript")) is not None])
        gain = None if sft_accuracy is None or row == "sft" else interval95([r.accuracy - sft_accuracy for r in mine])
        cells = [
            str(len(mine)),
            _cell(interval95([r.accuracy for r in mine]), 100),
            _cell(interval95([r.accuracy_direct for r in mine]), 100),
            _cell(interval95([r.accuracy - r.accuracy_direct for r in mine]), 100),
            _cell(gain, 100),
            _cell(interval95([r.eval_tool_calls for r in mine]), 1, 2),
            _cell(f_tau, 1, 2),
            _cell(kappa, 1, 2),
            _cell(f_tau_t, 1, 2),
            _cell(interval95([r.answer_tag_rate for r in mine if r.answer_tag_rate is not None]), 100),
            _cell(interval95([fmean(r.probe_calls.values()) for r in mine if r.probe_calls]), 1, 2),
            _cell(interval95([fmean(r.probe_format.values()) for r in mine if r.probe_format]), 1, 2),
        ]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def validation_table_markdown(runs: Sequence[ModelRun]) -> str:
    """Accuracy on the validation split per row ("" when no run was measured there); direct mode
    where it was measured (the default run measures it for the SFT model only)."""
    measured = [r for r in runs if r.accuracy_val is not None]
    if not measured:
        return ""
    lines = ["| row | seeds | accuracy, subagent mode (%) | accuracy, direct mode (%) | tool gain (points) |",
             "|" + "---|" * 5]
    for row in rows_in_order(measured):
        mine = _by_row(measured, row)
        both = [r for r in mine if r.accuracy_direct_val is not None]
        cells = [str(len(mine)), _cell(interval95([r.accuracy_val for r in mine]), 100),
                 _cell(interval95([r.accuracy_direct_val for r in both]), 100),
                 _cell(interval95([r.accuracy_val - r.accuracy_direct_val for r in both]), 100)]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def budget_table_markdown(points: Sequence[BudgetPoint]) -> str:
    """The SFT model at each overview budget K on validation ("" without points)."""
    if not points:
        return ""
    lines = ["| K (overview frames) | event on the overview (% of videos) | accuracy, subagent mode (%) | "
             "accuracy, direct mode (%) | tool gain (points) | crop calls per question |", "|---:|" + "---:|" * 5]
    for p in sorted(points, key=lambda p: p.k):
        lines.append(f"| {p.k} | {100 * p.visible:.1f} | {100 * p.accuracy:.1f} | {100 * p.accuracy_direct:.1f} | "
                     f"{100 * (p.accuracy - p.accuracy_direct):+.1f} | {p.eval_tool_calls:.2f} |")
    return "\n".join(lines) + f"\n\nValidation videos: {points[0].n}."


def verdicts(runs: Sequence[ModelRun]) -> list[str]:
    """One line per finding of SPEC §6 whose rows were run, then the runs that fell
    (`miniature.verdicts`: tests on run means, the SFT build a level, Holm families fixed in code)."""
    return [*judged.verdict_lines(runs), *judged.falls_lines(runs)]


def findings(runs: Sequence[ModelRun], tool_gain_target: float = 0.25, rl_gain_target: float = 0.10) -> list[str]:
    """The issue's checks on these measurements, one plain sentence each."""
    out = []
    sft = _by_row(runs, "sft")
    if sft:
        s = sft[0]
        gain = s.accuracy - s.accuracy_direct
        verdict = "met" if gain >= tool_gain_target else "NOT met"
        out.append(f"Tools necessary: the SFT model answers {100 * s.accuracy:.1f} % with sub-agents and "
                   f"{100 * s.accuracy_direct:.1f} % directly, a gain of {100 * gain:.1f} points "
                   f"(target >= {100 * tool_gain_target:.0f}: {verdict}).")
        for row in rows_in_order(runs):
            if row == "sft":
                continue
            diff = interval95([r.accuracy - s.accuracy for r in _by_row(runs, row)])
            if diff is None:
                continue
            verdict = "met" if diff.mean >= rl_gain_target and diff.low > 0 else "NOT met"
            target = f" (target >= {100 * rl_gain_target:.0f} with the interval above 0: {verdict})" \
                if row == "paragrpo" else ""
            out.append(f"{row} vs SFT: {100 * diff.mean:+.1f} points held-out accuracy, 95 % interval "
                       f"[{100 * diff.low:+.1f}, {100 * diff.high:+.1f}] over {diff.n} seed(s){target}.")
    kappa = {row: interval95([v for r in _by_row(runs, row) if (v := r.final("kappa")) is not None])
             for row in rows_in_order(runs) if row != "sft"}
    f_tau = {row: interval95([v for r in _by_row(runs, row) if (v := r.final("f_tau_fixed")) is not None])
             for row in rows_in_order(runs) if row != "sft"}
    if kappa.get("vanilla_grpo") and kappa.get("paragrpo"):
        v, p = kappa["vanilla_grpo"], kappa["paragrpo"]
        fv, fp = f_tau["vanilla_grpo"], f_tau["paragrpo"]
        (pfv, pkv), (pfp, pkp) = PAPER_TABLE2["vanilla_grpo"], PAPER_TABLE2["paragrpo"]
        out.append(f"Training κ at the end: vanilla_grpo {v.mean:.2f}, paragrpo {p.mean:.2f} (paper: {pkv:.2f} vs "
                   f"{pkp:.2f}); fτ_fixed: vanilla_grpo {fv.mean:.2f}, paragrpo {fp.mean:.2f} (paper: {pfv:.2f} vs "
                   f"{pfp:.2f}).")
    single = [row for row in ("anchoring_only", "gating_only") if kappa.get(row) and f_tau.get(row)]
    if single:
        parts = [f"{row} κ {kappa[row].mean:.2f}, fτ_fixed {f_tau[row].mean:.2f} (paper: {PAPER_TABLE2[row][1]:.2f}, "
                 f"{PAPER_TABLE2[row][0]:.2f})" for row in single]
        out.append("Single mechanisms at the end: " + "; ".join(parts) + ".")
    return out


# SPEC §6, Table 2: (fτ, κ) of the paper's rows after training.
PAPER_TABLE2 = {"vanilla_grpo": (0.13, 0.02), "paragrpo": (0.41, 0.21), "anchoring_only": (0.35, 0.19),
                "gating_only": (0.10, 1.36)}


def plot_steps(runs: Sequence[ModelRun], out: Path) -> Path:
    """fτ_fixed, κ and rollout accuracy per RL step, every row in one figure (mean, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(STEP_METRICS), figsize=(4.2 * len(STEP_METRICS), 3.4), dpi=120)
    for row in rows_in_order(runs):
        mine = [r for r in _by_row(runs, row) if r.steps]
        if not mine:
            continue
        for ax, (metric, label) in zip(axes, STEP_METRICS):
            per_step: dict[int, list[float]] = {}
            for run in mine:
                for s in run.steps:
                    if metric in s:
                        per_step.setdefault(int(s["step"]), []).append(float(s[metric]))
            steps = sorted(per_step)
            means = [sum(per_step[k]) / len(per_step[k]) for k in steps]
            line, = ax.plot(steps, means, marker="o", markersize=2.5, label=f"{row} (n={len(mine)})")
            ax.fill_between(steps, [min(per_step[k]) for k in steps], [max(per_step[k]) for k in steps],
                            color=line.get_color(), alpha=0.15, linewidth=0)
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("RL step")
            ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


VERDICT_RULES = (
    "The unit is the training run: each comparison is row A minus row B on one number per run (held-out "
    "accuracy, or the probe's κ or format), tested by Welch's t (t-based 95 % interval in brackets) and by an "
    "exact permutation test over runs; against the SFT model (one run) by a one-sample t and an exact sign-flip "
    "test. A direction is claimed only when both tests' Holm-adjusted p is below "
    f"{judged.ALPHA} and the effect is at least {100 * judged.MIN_ACCURACY:.0f} points of accuracy, "
    f"{judged.MIN_FORMAT:.2f} of the probe's answers in format, or a κ fall of {judged.KAPPA_FALL:.0%} of the "
    "SFT model's; \"equivalent\" when the 90 % t interval lies within that effect; otherwise inconclusive, with "
    "the runs a row the measured spread asks for; where the runs are too few for the exact tests to reach "
    "that p at all, the finding says so.")


def report_markdown(runs: Sequence[ModelRun], figure: str, title: str,
                    budget: Sequence[BudgetPoint] = ()) -> str:
    return "\n\n".join([
        f"# {title}",
        "Held-out questions asked as the SPEC §7 evaluation asks (greedy). Cells: mean over seeds ± the half "
        f"width of the 95 % t-interval. Training fτ_fixed / κ: mean of the last {LAST_STEPS} RL steps (SFT: the "
        "first RL step's rollouts, i.e. the SFT policy before any update). Answers in format: held-out answers "
        "(subagent mode) with a closed, non-blank `<answer>` block.",
        table_markdown(runs),
        *(["## Validation split",
           "The table above is the test split (`videomme`), evaluated once per model. Knobs, rates and budgets are "
           "chosen on this one (`videomme_val`: the same kind of questions on videos of its own).", validation]
          if (validation := validation_table_markdown(runs)) else []),
        *(["## By question group (held-out, subagent mode)", groups] if (groups := group_table_markdown(runs)) else []),
        *(["## Before RL: the SFT model at each overview budget K (validation split)",
           "What nFrames gating has to act on: the share of videos whose event an overview of K frames shows, and "
           "the SFT model's accuracy with and without tools at that K.", table]
          if (table := budget_table_markdown(budget)) else []),
        "## Findings",
        "\n".join(f"- {line}" for line in findings(runs)),
        *(["## The paper's findings (SPEC §6), verdicts", VERDICT_RULES, judged.design_line(runs),
           "\n".join(f"- {line}" for line in found),
           "Holm families, fixed in code before any run (`miniature.verdicts.FAMILIES`; the falls family "
           "`FALLS_FAMILY` and its threshold after the runs of 2026-11-28); a comparison whose rows were not run "
           "counts at p 1:", judged.families_markdown()]
          if (found := verdicts(runs)) else []),
        f"![per-step curves]({figure})",
    ]) + "\n"


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


def latest_logged(tracking_uri: str, experiment: str) -> tuple[list[ModelRun], list[BudgetPoint]]:
    """The latest reproduction run's measurements in MLflow: its runs.json and, where it logged
    one, its budget.json (the SFT model's budget sweep; empty before #35 logged it)."""
    import tempfile

    from paravt_core.registry.report import _client, _runs

    logged = _runs(tracking_uri, experiment, "reproduce")
    if not logged:
        raise ValueError(f"MLflow experiment {experiment!r} at {tracking_uri} has no reproduction run; "
                         "run `paravt reproduce` first")
    client, run_id = _client(tracking_uri), logged[-1].info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        source = f"the runs.json of MLflow run {run_id}"
        runs = runs_from_json(Path(client.download_artifacts(run_id, "reproduce/runs.json", tmp)).read_bytes(),
                              source)
        names = {Path(f.path).name for f in client.list_artifacts(run_id, "reproduce")}
        budget = budget_from_json(Path(client.download_artifacts(run_id, "reproduce/budget.json", tmp)).read_bytes(),
                                  f"the budget.json of MLflow run {run_id}") if "budget.json" in names else []
    return runs, budget


def read_report_dir(folder: Path) -> tuple[list[ModelRun], list[BudgetPoint]]:
    """The measurements a report folder holds (`runs.json`, and `budget.json` where written)."""
    runs_file = Path(folder) / "runs.json"
    if not runs_file.is_file():
        raise ValueError(f"{runs_file} does not exist: give the report folder `paravt reproduce` wrote "
                         "(<run.output_dir>/report)")
    budget_file = Path(folder) / "budget.json"
    try:
        return runs_from_json(runs_file.read_bytes(), str(runs_file)), \
            budget_from_json(budget_file.read_bytes(), str(budget_file)) if budget_file.is_file() else []
    except OSError as error:
        raise MeasurementsError(f"cannot read the report folder {folder}: {error}") from None


def budget_from_json(text: str | bytes, source: str = "budget.json") -> list[BudgetPoint]:
    """The budget sweep of a budget.json ([] when it measured none), checked like `runs_from_json`."""
    return _validated(_BUDGET, text, source)


def rebuilt_report_dir(out_dir: Path, source_dir: Path | None = None) -> Path:
    """`out_dir` checked as the folder a rebuilt report replaces whole (`rebuild_report`).

    Raises:
        MeasurementsError: `out_dir` is, holds or lies inside the folder read (a rebuild never
            writes where it reads: a failure there would damage the measurements themselves), or
            it exists and is not a report folder (its files would be replaced).
    """
    out = Path(out_dir).resolve()
    if source_dir is not None:
        source = Path(source_dir).resolve()
        if out == source or source in out.parents or out in source.parents:
            raise MeasurementsError(f"--out {out_dir} would write into the folder the report is rebuilt from "
                                    f"({source_dir}); give a new folder")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "report.md").is_file())):
        raise MeasurementsError(f"--out {out_dir} exists and is not a report folder (no report.md); its files would "
                                "be replaced: give a new folder")
    return out


def rebuild_report(runs: Sequence[ModelRun], out_dir: Path, title: str, budget: Sequence[BudgetPoint] = (),
                   source_dir: Path | None = None) -> Path:
    """`write_report` into a fresh folder that replaces `out_dir` in one rename, so a failure
    leaves the old report (or none), never a half-written one. Returns the report's path.

    Raises:
        MeasurementsError: see `rebuilt_report_dir`.
    """
    from paravt_core.atomic import atomic_dir

    out = rebuilt_report_dir(out_dir, source_dir)
    with atomic_dir(out) as tmp:
        write_report(runs, tmp, title, budget=budget)
    return out / "report.md"


def write_report(runs: Sequence[ModelRun], out_dir: Path, title: str, tracking_uri: str | None = None,
                 experiment: str | None = None, budget: Sequence[BudgetPoint] = ()) -> Path:
    """`<out_dir>/report.md`, `steps.png` and `runs.json` (the measurements); logged to MLflow
    as one run tagged `stage=reproduce` when a tracking URI is given. Returns the report's path."""
    from paravt_core.atomic import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    figure = plot_steps(runs, out_dir / "steps.png")
    data = atomic_write_text(out_dir / "runs.json", json.dumps([asdict(r) for r in runs], indent=1))
    budget_file = atomic_write_text(out_dir / "budget.json", json.dumps([asdict(p) for p in budget], indent=1))
    report = atomic_write_text(out_dir / "report.md", report_markdown(runs, figure.name, title, budget))
    if tracking_uri and experiment:
        from paravt_core.registry.report import _client
        from paravt_core.tracking import start_stage_run

        run_id = start_stage_run(tracking_uri, experiment, "reproduce", {"stage": "reproduce"}, {})
        client = _client(tracking_uri)
        for row in rows_in_order(runs):
            mine = _by_row(runs, row)
            client.log_metric(run_id, f"{row}_accuracy", sum(r.accuracy for r in mine) / len(mine))
            client.log_metric(run_id, f"{row}_accuracy_direct", sum(r.accuracy_direct for r in mine) / len(mine))
            if all(r.accuracy_val is not None for r in mine):
                client.log_metric(run_id, f"{row}_accuracy_val", sum(r.accuracy_val for r in mine) / len(mine))
        for path in (report, figure, data, budget_file):
            client.log_artifact(run_id, str(path), artifact_path="reproduce")
        client.set_terminated(run_id)
    return report
