"""The miniature reproduction's report in Markdown (#15): Table 2 in miniature, with intervals over seeds.

`paravt reproduce` trains one SFT model (or one per `reproduce.sft_seeds`, the SFT builds),
then each RL row of SPEC §6 from it once per seed, and evaluates every model on the held-out
questions twice: in `subagent` tool mode (the agent may crop, sub-agents summarize) and in
`direct` mode (no tools, the same overview).
This module renders those measurements (`measurements.py`, their statistics `intervals.py`) as

- `table_markdown`: one line per row: held-out accuracy in both modes, the tool gain
  (subagent minus direct), the gain over SFT (each run against its own build's SFT model), κ
  of the held-out evaluation, and fτ_fixed / κ of training (the mean of the last `LAST_STEPS`
  RL steps, as `paravt report` does; SPEC §5: fτ under one fixed definition for every row;
  also over the transcript, forced think prefixes included, which runs before that metric
  existed leave "–": see `rl.policy.fixed_format_reward`). Each cell is the mean over seeds with its
  95 % t-interval. The SFT row's training fτ / κ are those of the first RL step's rollouts
  (the SFT policy before any update). The last column is the share of held-out answers in the
  format asked for (a closed `<answer>` block with a body, SPEC §4.3), where the paper's
  format claims show on the evaluation rather than on sampled training text;
- `hosts_markdown`: the hosts (cores, CPU, CPU kernels, torch, threads) that trained the models, and
  whether they were more than one;
- `findings`: the issue's checks, computed (tools necessary, RL learns, the κ / fτ contrast);
- `verdicts`: one line per finding of SPEC §6, each comparison labelled from tests on run
  means (the SFT build a level) against minimum effects and Holm families fixed in code
  (`verdicts.py`, `inference.py`), and the runs that fell as their own outcome.

`report_markdown` puts them together with the validation, question-group and budget tables.
The paper's numbers beside ours come from the project's one copy of its Table 2
(`PAPER_TABLE2`). Every function here is a pure function of the measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from paravt_core.miniature.budget_choice import choice_markdown
from paravt_core.miniature import verdicts as judged
from paravt_core.miniature.intervals import Interval, by_row, interval95, rows_in_order, sft_training_start
from paravt_core.miniature.measurements import LAST_STEPS, BudgetPoint, ModelRun
from paravt_core.dist.weights import MODEL_META
from paravt_core.run_clock import ClockSummary, clock_markdown
from paravt_core.eval.experiment_report import PAPER_TABLE2


def group_table_markdown(runs: Sequence[ModelRun]) -> str:
    """Held-out accuracy (%) and crop calls per question per group, one line per row (mean over
    seeds ± the 95 % half width); "" when no run has groups."""
    groups = sorted({g for r in runs for g in r.by_group})
    if not groups:
        return ""
    head = "| row | seeds | " + " | ".join(f"{g}: accuracy (%) | {g}: κ" for g in groups) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(groups))]
    for row in rows_in_order(runs):
        mine = [r for r in by_row(runs, row) if r.by_group]
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


def _cell(interval: Interval | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if interval is None else interval.cell(scale, digits)


def table_markdown(runs: Sequence[ModelRun]) -> str:
    """Table 2 in miniature (see the module docstring); percentages for accuracies."""
    sft_accuracy = judged.sft_accuracies(runs)
    head = ("| row | seeds | accuracy, subagent mode (%) | accuracy, direct mode (%) | tool gain (points) | "
            "gain over SFT (points) | held-out κ | training fτ_fixed | training κ | training fτ_fixed, transcript | "
            "held-out answers in format (%) | probe κ, sampled | probe format, sampled |")
    lines = [head, "|" + "---|" * 13]
    for row in rows_in_order(runs):
        mine = by_row(runs, row)
        if row == "sft":
            start = sft_training_start(runs)
            f_tau = interval95([v for r in start if (v := r.first("f_tau_fixed")) is not None])
            kappa = interval95([v for r in start if (v := r.first("kappa")) is not None])
            f_tau_t = interval95([v for r in start if (v := r.first("f_tau_fixed_transcript")) is not None])
        else:
            f_tau = interval95([v for r in mine if (v := r.final("f_tau_fixed")) is not None])
            kappa = interval95([v for r in mine if (v := r.final("kappa")) is not None])
            f_tau_t = interval95([v for r in mine if (v := r.final("f_tau_fixed_transcript")) is not None])
        gain = None if row == "sft" else interval95([r.accuracy - sft_accuracy[r.sft_build] for r in mine
                                                     if r.sft_build in sft_accuracy])
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
        mine = by_row(measured, row)
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
    sft = by_row(runs, "sft")
    sft_accuracy = judged.sft_accuracies(runs)
    for s in sft:
        gain = s.accuracy - s.accuracy_direct
        verdict = "met" if gain >= tool_gain_target else "NOT met"
        name = "the SFT model" if s.sft_build is None else f"SFT build {s.sft_build}"
        out.append(f"Tools necessary: {name} answers {100 * s.accuracy:.1f} % with sub-agents and "
                   f"{100 * s.accuracy_direct:.1f} % directly, a gain of {100 * gain:.1f} points "
                   f"(target >= {100 * tool_gain_target:.0f}: {verdict}).")
    if sft:
        for row in rows_in_order(runs):
            if row == "sft":
                continue
            diff = interval95([r.accuracy - sft_accuracy[r.sft_build] for r in by_row(runs, row)
                               if r.sft_build in sft_accuracy])
            if diff is None:
                continue
            verdict = "met" if diff.mean >= rl_gain_target and diff.low > 0 else "NOT met"
            target = f" (target >= {100 * rl_gain_target:.0f} with the interval above 0: {verdict})" \
                if row == "paragrpo" else ""
            out.append(f"{row} vs SFT: {100 * diff.mean:+.1f} points held-out accuracy, 95 % interval "
                       f"[{100 * diff.low:+.1f}, {100 * diff.high:+.1f}] over {diff.n} seed(s){target}.")
    kappa = {row: interval95([v for r in by_row(runs, row) if (v := r.final("kappa")) is not None])
             for row in rows_in_order(runs) if row != "sft"}
    f_tau = {row: interval95([v for r in by_row(runs, row) if (v := r.final("f_tau_fixed")) is not None])
             for row in rows_in_order(runs) if row != "sft"}
    if kappa.get("vanilla_grpo") and kappa.get("paragrpo"):
        v, p = kappa["vanilla_grpo"], kappa["paragrpo"]
        fv, fp = f_tau["vanilla_grpo"], f_tau["paragrpo"]
        (pfv, pkv), (pfp, pkp) = PAPER_TABLE2["vanilla_grpo"][:2], PAPER_TABLE2["paragrpo"][:2]
        out.append(f"Training κ at the end: vanilla_grpo {v.mean:.2f}, paragrpo {p.mean:.2f} (paper: {pkv:.2f} vs "
                   f"{pkp:.2f}); fτ_fixed: vanilla_grpo {fv.mean:.2f}, paragrpo {fp.mean:.2f} (paper: {pfv:.2f} vs "
                   f"{pfp:.2f}).")
    single = [row for row in ("anchoring_only", "gating_only") if kappa.get(row) and f_tau.get(row)]
    if single:
        parts = [f"{row} κ {kappa[row].mean:.2f}, fτ_fixed {f_tau[row].mean:.2f} (paper: {PAPER_TABLE2[row][1]:.2f}, "
                 f"{PAPER_TABLE2[row][0]:.2f})" for row in single]
        out.append("Single mechanisms at the end: " + "; ".join(parts) + ".")
    return out


def hosts_markdown(runs: Sequence[ModelRun]) -> str:
    """Which hosts trained the report's models, from each model's recorded `numerics`.

    The host's cores, the CPU kernels torch picks, torch's version and a rank's thread count
    decide the weights (docs/miniature.md, "What a build depends on"), and on a GPU the card and
    its CUDA; the CPU itself may (not measured), so it and the accelerator count where every
    record has the CPU. A reproduction resumed on another host, or under another
    OMP_NUM_THREADS, goes on from models the first host trained: the line says when the models
    come from more than one such setting, and the report is then what they gave together, not
    what one host's `paravt reproduce` gives. Empty where no model recorded its numerics."""
    hosts: dict[tuple, dict[str, list[int]]] = {}
    unrecorded = [run for run in runs if run.numerics is None]
    recorded = [run for run in runs if run.numerics is not None]
    # The CPU counts only where every record has it (records from before it leave it out).
    with_cpu = all("cpu" in run.numerics for run in recorded)
    for run in recorded:
        n = run.numerics
        kind = "sft" if run.row == "sft" else "rl"
        # With the CPU recorded, a model without an accelerator was trained on the CPU.
        host = (n.get("accelerator") if with_cpu else None, n["host_cpus"], n["cpu"] if with_cpu else None,
                n["cpu_capability"], n["torch"])
        hosts.setdefault(host, {}).setdefault(kind, []).append(n["torch_threads"])
    if not hosts:
        return ""

    def models(kind: str, count: int) -> str:
        return f"{count} SFT model{'s' * (count != 1)}" if kind == "sft" else f"{count} RL run{'s' * (count != 1)}"

    parts = []
    for (accelerator, cpus, cpu, capability, torch), kinds in sorted(
            hosts.items(), key=lambda item: -sum(map(len, item[1].values()))):
        each = [f"{models(kind, len(threads))} on {' or '.join(map(str, sorted(set(threads))))} "
                f"thread{'s' * (max(threads) != 1)}" for kind, threads in sorted(kinds.items(), reverse=True)]
        host = [*([accelerator] if accelerator else []), f"{cpus if cpus is not None else 'unknown'} cores",
                *([cpu] if cpu else []), capability, f"torch {torch}"]
        parts.append(f"{', '.join(host)}: {', '.join(each)}")
    if unrecorded:
        counts = {kind: sum((r.row == "sft") == (kind == "sft") for r in unrecorded) for kind in ("sft", "rl")}
        parts.append("not recorded: " + ", ".join(models(kind, n) for kind, n in counts.items() if n))
    text = f"Trained on (each model's `numerics` in its `{MODEL_META}`): " + "; ".join(parts) + "."
    settings = len(hosts) + sum(len(set(threads)) - 1 for kinds in hosts.values() for threads in kinds.values())
    if settings > 1:
        text += (f" **These models come from {settings} host settings** (accelerator, cores, CPU, CPU kernels, "
                 "torch or threads), which can train other weights from the same inputs (the cores, the kernels "
                 "and the threads were measured to): this report is what they gave together, not what one host's "
                 "`paravt reproduce` gives.")
    elif unrecorded:
        text += " The models without a record may come from another host."
    return text


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
                    budget: Sequence[BudgetPoint] = (), running: ClockSummary | None = None) -> str:
    """The report; `running`, the reproduction's running time over its invocations (`run_clock`),
    goes under the table where known."""
    return "\n\n".join([
        f"# {title}",
        "Held-out questions asked as the SPEC §7 evaluation asks (greedy). Cells: mean over seeds ± the half "
        f"width of the 95 % t-interval. Training fτ_fixed / κ: mean of the last {LAST_STEPS} RL steps (SFT: the "
        "first RL step's rollouts, i.e. the SFT policy before any update). Answers in format: held-out answers "
        "(subagent mode) with a closed, non-blank `<answer>` block.",
        table_markdown(runs),
        *([hosts] if (hosts := hosts_markdown(runs)) else []),
        *([clock_markdown(running, "paravt reproduce")] if running else []),
        *(["## Validation split",
           "The table above is the test split (`videomme`), evaluated once per model. Knobs, rates and budgets are "
           "chosen on this one (`videomme_val`: the same kind of questions on videos of its own).", validation]
          if (validation := validation_table_markdown(runs)) else []),
        *(["## The RL budget chosen on validation", choice] if (choice := choice_markdown(runs)) else []),
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
