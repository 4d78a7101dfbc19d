"""The benchmarks' measuring harness: the fixed-cost fits, the process-tree CPU and the quiet-machine record
(imgest.bench.quiet), shared by every benchmark."""

from __future__ import annotations

import statistics


def fixed_cost(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per image) of a least-squares line through (images, seconds); fixed >= 0."""
    import numpy as np

    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    if len(points) < 2:
        return 0.0, float(ys[0] / xs[0]) if len(points) else 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    return max(0.0, float(intercept)), float(slope)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of YS over XS; with one point, no intercept."""
    if len(xs) < 2:
        return 0.0, ys[0] / xs[0]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope
