"""The benchmarks' measuring harness: the fixed-cost fits, the process-tree CPU and the quiet-machine record
(imgest.bench.quiet), shared by every benchmark."""

from __future__ import annotations


def fixed_cost(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per image) of a least-squares line through (images, seconds); fixed >= 0."""
    import numpy as np

    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    if len(points) < 2:
        return 0.0, float(ys[0] / xs[0]) if len(points) else 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    return max(0.0, float(intercept)), float(slope)
