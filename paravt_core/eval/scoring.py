"""Scoring shared by the benchmark evaluator (SPEC §7) and the RL accuracy reward (SPEC §4.2)."""

from __future__ import annotations


def interval_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Temporal IoU of two [start, end] intervals.

    SPEC §4.2 writes the union as len_a + len_b - overlap and SPEC §7 as
    max end - min start; both agree whenever the intervals overlap, and the IoU is 0
    otherwise, so one function serves both.
    """
    (s1, e1), (s2, e2) = a, b
    overlap = max(0.0, min(e1, e2) - max(s1, s2))
    if overlap <= 0.0:
        return 0.0
    union = (e1 - s1) + (e2 - s2) - overlap
    return overlap / union if union > 0 else 0.0
