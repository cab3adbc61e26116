"""Boolean masks of the things events draw: five shapes and the ten digits.

Digits come from a 5x7 bitmap font defined here (no font files), scaled up by whole
pixels; shapes are rasterised at pixel centres.
"""

from __future__ import annotations

import math

import numpy as np

# 5 columns x 7 rows per digit; "#" is ink.
DIGIT_BITMAPS: dict[int, tuple[str, ...]] = {
    0: (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    1: ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    2: (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    3: ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    4: ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    5: ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    6: ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    7: ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    8: (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    9: (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
}
FONT_COLUMNS, FONT_ROWS = 5, 7


def digit_mask(digit: int, scale: int) -> np.ndarray:
    """The digit's bitmap with every font pixel blown up to scale x scale: [7*scale, 5*scale]."""
    bitmap = np.array([[ch == "#" for ch in row] for row in DIGIT_BITMAPS[digit]])
    return np.kron(bitmap, np.ones((scale, scale), dtype=bool))


def _polygon_mask(vertices: list[tuple[float, float]], size: int) -> np.ndarray:
    """Even-odd fill of a polygon (x, y in pixels) sampled at pixel centres: [size, size]."""
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    inside = np.zeros((size, size), dtype=bool)
    for (x1, y1), (x2, y2) in zip(vertices, vertices[1:] + vertices[:1], strict=True):
        if y1 == y2:
            continue
        crosses = (ys >= min(y1, y2)) & (ys < max(y1, y2))
        x_at_y = x1 + (ys - y1) * (x2 - x1) / (y2 - y1)
        inside ^= crosses & (xs < x_at_y)
    return inside


def _star_vertices(size: int) -> list[tuple[float, float]]:
    centre, outer, inner = size / 2, size / 2, size * 0.24
    return [
        (
            centre + (outer if k % 2 == 0 else inner) * math.sin(k * math.pi / 5),
            centre - (outer if k % 2 == 0 else inner) * math.cos(k * math.pi / 5),
        )
        for k in range(10)
    ]


def shape_mask(shape: str, size: int) -> np.ndarray:
    """A filled shape inscribed in a size x size box: [size, size]."""
    if shape == "square":
        return np.ones((size, size), dtype=bool)
    if shape == "circle":
        ys, xs = np.mgrid[0:size, 0:size] + 0.5
        return (xs - size / 2) ** 2 + (ys - size / 2) ** 2 <= (size / 2) ** 2
    if shape == "triangle":
        return _polygon_mask([(size / 2, 0.0), (float(size), float(size)), (0.0, float(size))], size)
    if shape == "diamond":
        half = size / 2
        return _polygon_mask([(half, 0.0), (float(size), half), (half, float(size)), (0.0, half)], size)
    if shape == "star":
        return _polygon_mask(_star_vertices(size), size)
    raise ValueError(f"unknown shape {shape!r}; expected one of square, circle, triangle, diamond, star")
