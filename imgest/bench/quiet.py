"""Was the machine quiet while a benchmark ran? The names imgest.bench.plugin* import; they live in
imgest.bench.measure, the one measuring harness (import them from there)."""

from __future__ import annotations

from imgest.bench.measure import QUIET_CORES, Quietness, QuietWatch, TreeSampler, tree_seconds

__all__ = ["QUIET_CORES", "QuietWatch", "Quietness", "TreeSampler", "tree_seconds"]
