"""The miniature reproduction's per-step figure: fτ_fixed, κ and the rollouts' accuracy per RL
step for all rows in one figure (mean over seeds, min-max band)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from paravt_core.miniature.intervals import by_row, rows_in_order
from paravt_core.miniature.measurements import ModelRun


STEP_METRICS = (("f_tau_fixed", "fτ (fixed R_fmt, τ = 0.7)"), ("kappa", "κ (tool calls per rollout)"),
                ("reward_acc", "accuracy of the rollouts (R_acc)"))


def plot_steps(runs: Sequence[ModelRun], out: Path) -> Path:
    """fτ_fixed, κ and rollout accuracy per RL step, every row in one figure (mean, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(STEP_METRICS), figsize=(4.2 * len(STEP_METRICS), 3.4), dpi=120)
    for row in rows_in_order(runs):
        mine = [r for r in by_row(runs, row) if r.steps]
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
