"""The generated world's vocabulary: its palette and the question topics of each event kind.

A leaf module: the world's config validates names against it, the world draws from it and the
questions ask about it.
"""

from __future__ import annotations

# Saturated colours (max - min channel >= 150), far from the low-saturation backgrounds.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 30, 30),
    "green": (30, 200, 45),
    "blue": (40, 70, 235),
    "yellow": (240, 220, 30),
    "purple": (150, 35, 210),
    "orange": (250, 135, 15),
    "cyan": (20, 205, 225),
}

EVENT_TOPICS: dict[str, tuple[str, ...]] = {
    "shape": ("colour", "shape", "position", "when"),
    "digit": ("digit", "colour", "when"),
    "motion": ("direction", "colour", "shape", "when"),
}
