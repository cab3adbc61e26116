"""The paper's findings (SPEC §6) judged on the reproduction's runs (#62 item 1).

Each finding is a family of comparisons of rows, fixed here in code before any run (`FAMILIES`),
and printed with the report (`families_markdown`). A comparison's rows that were not run still
count in its family's Holm adjustment, at p = 1, so a label never changes with how many rows a
profile trains (it did: "both together win" was p 0.028 alone in the default and 0.085 among
three in the Table 2 profile). Each comparison is made on run-level values (`run_value`) by
`inference` (runs of one SFT build; or per-build differences when the runs come from several
builds), labelled against a minimum effect fixed here, and an inconclusive one says how many
runs a row (or builds) the measured spread asks for.

Runs that fell are their own outcome (`falls_lines`): a run falls when its held-out accuracy is
`FALL_POINTS` or more below its own SFT model's; PARA-GRPO's share against each other RL row's,
Fisher's exact test, Holm over `FALLS_FAMILY`.

Pure functions of the runs (anything with the fields of `measurements.ModelRun`); the report
(`report_tables.report_markdown`) renders their lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from paravt_core.miniature.inference import (
    ALPHA,
    MAX_UNITS,
    POWER,
    Estimate,
    against_value,
    fisher_exact,
    holm,
    label,
    units_needed,
    welch,
)

# Minimum effects of the verdicts, fixed before any run of the world they judge (#46 item 4):
# a finding's direction is claimed only for an effect at least this large (`inference.label`).
MIN_ACCURACY = 0.05  # 5 points of held-out accuracy
MIN_FORMAT = 0.10  # |Δ| of the share of probe answers in format (fτ measured on the held-out probe)
KAPPA_FALL = 0.5  # a collapse or a suppression: κ falls by at least half of the SFT model's
# A run that fell: held-out accuracy (subagent mode) at least this far below its SFT model's.
# Fixed on 2026-11-29 after the default's runs of 2026-11-28 were seen (#62): it applies from then on.
FALL_POINTS = 0.10

SFT = "sft"


@dataclass(frozen=True)
class Comparison:
    """`measure` of row `a` minus row `b`, the sign the paper's finding predicts, the minimum effect."""

    part: str
    measure: str  # "accuracy" (ModelRun.accuracy), "kappa" (probe_calls), "format" (probe_format)
    a: str
    b: str
    sign: int
    min_effect: float | None = None  # None: KAPPA_FALL x the SFT model's probe κ


# SPEC §6's findings (Table 2: SFT κ 2.50; GRPO κ 0.02 and fτ 0.13; anchoring only κ 0.19, fτ
# 0.35; gating only κ 1.36, fτ 0.10; PARA-GRPO κ 0.21, fτ 0.41). Each tuple is one Holm family.
FAMILIES: tuple[tuple[str, tuple[Comparison, ...]], ...] = (
    ("GRPO after SFT collapses κ", (Comparison("κ falls", "kappa", "vanilla_grpo", SFT, -1),)),
    ("Anchoring alone holds format but suppresses tools", (
        Comparison("format held (vs vanilla_grpo)", "format", "anchoring_only", "vanilla_grpo", +1, MIN_FORMAT),
        Comparison("tools suppressed (vs SFT)", "kappa", "anchoring_only", SFT, -1))),
    ("Gating alone keeps tools but loses format", (
        Comparison("tools kept (vs vanilla_grpo)", "kappa", "gating_only", "vanilla_grpo", +1),
        Comparison("format lost (vs paragrpo)", "format", "gating_only", "paragrpo", -1, MIN_FORMAT))),
    ("Both together win (PARA-GRPO above every other RL row on held-out accuracy)", tuple(
        Comparison(f"vs {row}", "accuracy", "paragrpo", row, +1, MIN_ACCURACY)
        for row in ("vanilla_grpo", "anchoring_only", "gating_only"))),
    ("PARA-GRPO improves on its SFT model", (Comparison("accuracy", "accuracy", "paragrpo", SFT, +1, MIN_ACCURACY),)),
)
# The share of runs that fell: PARA-GRPO against each other RL row, one Holm family.
FALLS_FAMILY: tuple[tuple[str, str], ...] = (("paragrpo", "vanilla_grpo"), ("paragrpo", "anchoring_only"),
                                             ("paragrpo", "gating_only"))


def run_value(run, measure: str) -> float | None:
    """One run's value of a measure: held-out accuracy, or the mean over the probe's questions of
    crop calls (κ) or answers in format; None where the probe was not measured."""
    if measure == "accuracy":
        return float(run.accuracy)
    per_question = run.probe_calls if measure == "kappa" else run.probe_format
    return fmean(per_question.values()) if per_question else None


def builds(runs: Sequence) -> list:
    """The SFT builds of these runs, in first-seen order (None: the report's one SFT model)."""
    return list(dict.fromkeys(r.sft_build for r in runs))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def compare(runs: Sequence, c: Comparison) -> tuple[Estimate | None, str]:
    """(the estimate, "" ) or (None, why there is none). One build: `a`'s runs against `b`'s (or
    against the SFT model); several: per build the difference of the rows' means, the builds
    tested (`inference`)."""
    sides = [[r for r in runs if r.row == row] for row in (c.a, c.b)]
    if any(run_value(r, c.measure) is None for side in sides for r in side):
        return None, f"not measured: no held-out probe for {c.a} or {c.b}"
    by_build = {b: [[run_value(r, c.measure) for r in side if r.sft_build == b] for side in sides]
                for b in builds([*sides[0], *sides[1]])}
    complete = {b: (a, v) for b, (a, v) in by_build.items() if a and v}
    if len(complete) >= 2:
        return against_value([_mean(a) - _mean(v) for a, v in complete.values()], 0.0, unit="build"), ""
    if not complete:
        return None, f"no SFT build has runs of both {c.a} and {c.b}"
    a, v = next(iter(complete.values()))
    if c.b == SFT:
        if len(a) < 2:
            return None, f"{len(a)} run of {c.a}: no spread between runs to test against"
        return against_value(a, v[0]), ""
    if min(len(a), len(v)) < 2:
        return None, f"{len(a)} and {len(v)} runs: a row needs at least 2 for a spread between runs"
    return welch(a, v), ""


def _minimum(runs: Sequence, c: Comparison) -> float | None:
    if c.min_effect is not None:
        return c.min_effect
    kappas = [v for r in runs if r.row == SFT and (v := run_value(r, "kappa")) is not None]
    return KAPPA_FALL * _mean(kappas) if kappas and _mean(kappas) > 0 else None


def _number(measure: str, value: float, signed: bool = True) -> str:
    if measure == "accuracy":
        return f"{100 * value:{'+' if signed else ''}.1f}"
    return f"{value:{'+' if signed else ''}.2f}"


def _needed(e: Estimate, measure: str, minimum: float, family: int) -> str:
    """The runs (or builds) `inference.units_needed` gives at this comparison's measured spread."""
    n = units_needed(e.sd if e.spread_seen else 0.0, minimum, family, e.paired)
    what = "builds" if e.unit == "build" else ("runs" if e.paired else "runs a row")
    sd = f"{_number(measure, e.sd, False)}{' points' if measure == 'accuracy' else ''}"
    at = (f"{POWER:.0%} power of the t test at two-sided {ALPHA}/{family}, noncentral t, SD {sd} as measured"
          if e.spread_seen else f"at least, for the exact test to reach {ALPHA}/{family}: no spread seen to size it by")
    if n is None:
        return f"needs more than {MAX_UNITS} {what} ({at})"
    have = e.units[0] if e.paired else min(e.units)
    if e.spread_seen and n <= have:
        # Enough units for the minimum effect, yet no verdict: the estimate is short of the minimum
        # effect (or the tests miss it) while the interval reaches past it. More units narrow that
        # interval; saying "needs n" with n already here would read as a count to reach.
        short = (f"the estimate is under the minimum effect and its 90 % interval reaches past it"
                 if abs(e.mean) < minimum else "the tests do not reach the level")
        return (f"has the {n} {what} that {at} asks for the minimum effect; {short}: neither the finding "
                f"nor equivalence, and more {what} would narrow it")
    return f"needs {n} {what} ({at})"


def _comparison_text(c: Comparison, e: Estimate, verdict: str, adjusted: float, minimum: float, family: int) -> str:
    unit = " points" if c.measure == "accuracy" else ""
    test = ("Welch t" if not e.paired else "one-sample t") + f" (df {e.df:.1f})"
    exact = "sign-flip" if e.paired else "permutation"
    sizes = f"{e.units[0]} {e.unit}s" + ("" if e.paired and e.unit == "build" else
                                        f" vs {'the SFT model' if e.paired else f'{e.units[1]}'}")
    text = (f"{c.part}: {verdict} ({c.a} - {c.b} {_number(c.measure, e.mean)}{unit} "
            f"[{_number(c.measure, e.low)}, {_number(c.measure, e.high)}], {test} p {e.p_t:.3f}, exact {exact} "
            f"p {e.p_exact:.3f}, Holm p {adjusted:.3f}, minimum effect {_number(c.measure, minimum, False)}{unit}, "
            f"{sizes}")
    if not e.spread_seen:
        alike = (f"each row's {e.unit}s give the same value" if not e.paired else
                 f"every {e.unit} gives the same {'difference' if e.unit == 'build' else 'value'}")
        text += f"; {alike}, so the t interval is a point: no spread seen, not a small one"
    if verdict == "inconclusive":
        text += "; " + _needed(e, c.measure, minimum, family)
    return text + ")"


def verdict_lines(runs: Sequence) -> list[str]:
    """One line per family of `FAMILIES` with at least one comparison whose rows were run: each
    comparison labelled (`inference.label`), Holm over the whole family as fixed."""
    out = []
    for finding, comparisons in FAMILIES:
        ran = [all(any(r.row == row for r in runs) for row in (c.a, c.b)) for c in comparisons]
        if not any(ran):
            continue
        results = [compare(runs, c) if ok else (None, "not run") for c, ok in zip(comparisons, ran)]
        adjusted = holm([e.p if e is not None else 1.0 for e, _ in results])
        parts = []
        for c, (e, why), p_holm in zip(comparisons, results, adjusted):
            minimum = _minimum(runs, c)
            if e is None:
                parts.append(f"{c.part}: not run (counted at p 1 in the family)" if why == "not run" else
                             f"{c.part}: inconclusive ({why})")
            elif minimum is None:
                parts.append(f"{c.part}: inconclusive (the SFT model makes no tool call on the probe: no κ to fall "
                             f"from; {c.a} - {c.b} {_number(c.measure, e.mean)})")
            else:
                parts.append(_comparison_text(c, e, label(e, minimum, c.sign, p_holm), p_holm, minimum,
                                              len(comparisons)))
        floor = min((e.p_floor for e, _ in results if e is not None), default=1.0)
        if len(comparisons) * floor >= ALPHA:
            parts.append(f"at these sizes no direction can be claimed: the exact test's smallest p is {floor:.3f} and "
                         f"Holm over the family's {len(comparisons)} needs one below "
                         f"{ALPHA / len(comparisons):.3f}")
        out.append(f"{finding}: " + "; ".join(parts) + ".")
    return out


def sft_accuracies(runs: Sequence) -> dict[str | None, float]:
    """Held-out accuracy with tools of each SFT build's model (`ModelRun.sft_build`: None for the
    one SFT model of a report): what an RL run of that build is held against."""
    return {r.sft_build: r.accuracy for r in runs if r.row == SFT}


def fell(runs: Sequence) -> Mapping[str, tuple[int, int]]:
    """Per RL row, (runs that fell, runs judged): a run falls when its held-out accuracy is at least
    `FALL_POINTS` below that of the SFT model of its build; runs whose build has no SFT model are
    not judged."""
    sft = sft_accuracies(runs)
    out: dict[str, tuple[int, int]] = {}
    for r in runs:
        if r.row == SFT or r.sft_build not in sft:
            continue
        k, n = out.get(r.row, (0, 0))
        out[r.row] = (k + (r.accuracy <= sft[r.sft_build] - FALL_POINTS + 1e-12), n + 1)
    return out


def falls_lines(runs: Sequence) -> list[str]:
    """The runs that fell per RL row, and PARA-GRPO's share against each other row's (`FALLS_FAMILY`)."""
    counts = fell(runs)
    if not counts:
        return []
    out = [f"Runs that fell (held-out accuracy {100 * FALL_POINTS:.0f} or more points below their SFT model's): "
           + ", ".join(f"{row} {k} of {n}" for row, (k, n) in counts.items()) + "."]
    tested = [(a, b) for a, b in FALLS_FAMILY if a in counts and b in counts]
    if tested:
        p = [fisher_exact(*counts[a], *counts[b]) if (a, b) in tested else 1.0 for a, b in FALLS_FAMILY]
        adjusted = holm(p)
        parts = []
        for (a, b), p_raw, p_holm in zip(FALLS_FAMILY, p, adjusted):
            if (a, b) not in tested:
                continue
            rate_a, rate_b = (counts[r][0] / counts[r][1] for r in (a, b))
            verdict = ("inconclusive" if p_holm >= ALPHA else
                       f"{a} falls {'more' if rate_a > rate_b else 'less'} often")
            parts.append(f"{a} against {b}: {verdict} ({counts[a][0]} of {counts[a][1]} against {counts[b][0]} of "
                         f"{counts[b][1]}, Fisher exact p {p_raw:.3f}, Holm p {p_holm:.3f} over {len(FALLS_FAMILY)})")
        floor = min(_fisher_floor(counts[a][1], counts[b][1]) for a, b in tested)
        if len(FALLS_FAMILY) * floor >= ALPHA:
            parts.append(f"at these sizes no direction can be claimed: Fisher's smallest p is {floor:.3f} and Holm "
                         f"over {len(FALLS_FAMILY)} needs one below {ALPHA / len(FALLS_FAMILY):.3f}")
        # FALL_POINTS was fixed after the runs of 2026-11-28 were seen: for those runs this is a
        # description, not a test decided beforehand.
        out.append("Runs that fell, PARA-GRPO against each other RL row (descriptive for runs made before the "
                   "threshold was fixed, 2026-11-29; a row not run counts at p 1): " + "; ".join(parts) + ".")
    return out


def _fisher_floor(n_a: int, n_b: int) -> float:
    """The smallest two-sided Fisher exact p that rows of `n_a` and `n_b` judged runs can give."""
    return min(fisher_exact(k_a, n_a, k_b, n_b) for k_a in range(n_a + 1) for k_b in range(n_b + 1))


def design_line(runs: Sequence) -> str:
    """What the verdicts can generalize to: one SFT build, or several."""
    n = len(builds(runs))
    if n <= 1:
        return ("One SFT build: every RL run starts from the same SFT model, so each verdict is about RL runs "
                "from that one model, and nothing generalizes past that build (another build of the same world "
                "can come out the other way: docs/miniature.md).")
    return (f"{n} SFT builds: each comparison is taken within each build (the mean of its runs of each row, or its "
            "SFT model) and the builds' differences are the units, so the verdicts hold across builds.")


def families_markdown() -> str:
    """The Holm families as fixed in code, one line each."""
    lines = []
    for finding, comparisons in FAMILIES:
        what = "; ".join(f"{c.a} - {c.b} ({c.measure}, predicted {'rise' if c.sign > 0 else 'fall'})"
                         for c in comparisons)
        lines.append(f"- {finding} ({len(comparisons)}): {what}")
    falls = "; ".join(f"{a} vs {b}" for a, b in FALLS_FAMILY)
    lines.append(f"- Runs that fell ({len(FALLS_FAMILY)}, Fisher exact): {falls}")
    return "\n".join(lines)
