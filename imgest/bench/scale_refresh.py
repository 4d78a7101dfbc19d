"""`imgest bench scale --refresh`: the `refresh_<name>` DAG's path at each size, step by step.

Per target and size, a dataset is registered in a datasets file of the run (as the DAG's datasets file holds it)
over a private copy of the size's source made of hard links (the cached tree is never written: a mutated file is
written under a new name and renamed over the link, a removed one is unlinked), and three refreshes are measured,
each sub-step in its own process like the ingest steps (`imgest.bench.scale_step`):

- ``refresh_first``: scan, plan, prepare, ingest, finish: the first version, every image ingested through the
  refresh path;
- ``refresh_nochange``: scan and plan with no source change (the plan says unchanged: no job);
- ``refresh_change``: after a seeded mutation of 0.1 % of the images (a third changed in place with new JPEG bytes,
  a third added, a third removed): scan, plan, prepare, ingest, finish.

The private copy is deleted afterwards, so every run starts from the same data.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PHASES: dict[str, tuple[str, ...]] = {
    "refresh_first": ("scan", "plan", "prepare", "ingest", "finish"),
    "refresh_nochange": ("scan", "plan"),
    "refresh_change": ("scan", "plan", "prepare", "ingest", "finish"),
}
CHANGE_FRACTION = 0.001
MUTATION_SEED = 24
# A refresh is proportional to its change when the marginal cost of its steps after the scan, per image of the
# dataset, is at most SLACK x the change fraction x a full ingest's per image, plus BOOKKEEPING x that for the O(N)
# columnar comparison of the scan with the baseline (read two parquet files, one hash join).
PROPORTIONAL_SLACK = 10.0
BOOKKEEPING = 0.02


@dataclass(frozen=True)
class Mutation:
    """What `mutate` did to a source tree (paths relative to its root)."""

    changed: list[str]
    added: list[str]
    removed: list[str]

    def counts(self) -> dict[str, int]:
        return {"added": len(self.added), "changed": len(self.changed), "removed": len(self.removed)}


def steps(phase: str) -> list[str]:
    """The step names of PHASE, as they appear in the rows (``refresh_change.plan``)."""
    return [f"{phase}.{sub}" for sub in PHASES[phase]]


def private_copy(source: Path, dest: Path) -> Path:
    """DEST: a tree of hard links to every file of SOURCE (no byte copied; SOURCE is never written through it)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(source), str(dest)], check=True)
    return dest


def _spec_of(root: Path) -> Any:
    from imgest.sources.devdata.countscale import SPEC_FILE, CountScaleSpec

    recorded = json.loads((root / SPEC_FILE).read_text())
    return CountScaleSpec(**{f.name: recorded[f.name] for f in fields(CountScaleSpec) if f.name in recorded})


def _replace(path: Path, data: bytes) -> None:
    """Write DATA as PATH through a new file renamed over it: a hard link at PATH is replaced, never written."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def mutate(root: Path, images: int, fraction: float = CHANGE_FRACTION, seed: int = MUTATION_SEED) -> Mutation:
    """Change FRACTION of the IMAGES of the count-scale tree ROOT (train images; at least one of each kind): a
    third rewritten in place with new JPEG bytes, a third added, a third removed; seeded, so every run makes the
    same change. ROOT must be a private copy: files are replaced or unlinked, never written through."""
    from imgest.sources.devdata.countscale import CLS_LOC, distinct_jpeg

    spec = _spec_of(root)
    each = max(1, round(images * fraction / 3))
    train = root / CLS_LOC / "train"
    classes = sorted(p.name for p in train.iterdir() if p.is_dir())
    counts = np.array([sum(1 for _ in os.scandir(train / c)) for c in classes])
    rng = np.random.default_rng(seed)
    picks = rng.choice(int(counts.sum()), size=2 * each, replace=False)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    listed: dict[int, list[str]] = {}
    paths = []
    for pick in picks.tolist():
        cls = int(np.searchsorted(starts, pick, side="right") - 1)
        names = listed.setdefault(cls, sorted(os.listdir(train / classes[cls])))
        paths.append(train / classes[cls] / names[pick - int(starts[cls])])
    changed, removed = paths[:each], paths[each:]
    for n, path in enumerate(changed):
        _replace(path, distinct_jpeg(spec, n))
    for path in removed:
        path.unlink()
    added = []
    for n, cls in enumerate(rng.integers(0, len(classes), size=each).tolist()):
        path = train / classes[cls] / f"{classes[cls]}_refresh{n}.JPEG"
        _replace(path, distinct_jpeg(spec, each + n))
        added.append(path)
    rel = [[str(p.relative_to(root)) for p in group] for group in (changed, added, removed)]
    log.info("mutated %s: %d changed, %d added, %d removed", root, each, each, each)
    return Mutation(*rel)


def write_datasets_file(path: Path, name: str, settings: dict[str, Any]) -> Path:
    """PATH: a datasets file registering NAME with SETTINGS (the refresh DAG's entry; checked as the DAG checks it)."""
    from imgest.flow.registry import load_registry

    lines = [f"[datasets.{name}]"]
    for key, value in settings.items():
        lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    registry = load_registry(path)
    if registry.errors:
        raise ValueError(f"{path}: {'; '.join(registry.errors)}")
    return path


def run_refresh_size(kind: str, label: str, source: Path, images: int, target: str, out: Path) -> list[dict[str, Any]]:
    """The three refreshes of TARGET over a private copy of SOURCE (IMAGES images); one row per sub-step."""
    from imgest.bench.scale_run import peak, peak_role, reset_dataset, run_step, stored_bytes
    from imgest.core.settings import S3Settings

    dataset = f"scale-{kind}-{label}-{target}-refresh"
    keyspace = dataset.replace("-", "_")
    dest = f"s3://{S3Settings.from_env().bucket}/{dataset}"
    reset_dataset(dataset, keyspace, dest)
    run_dir = out / dataset
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    tree = private_copy(source, run_dir / "source")
    settings = {"source": str(tree), "layout": "cls-loc", "targets": [target], "keyspace": keyspace, "s3_dest": dest}
    state: dict[str, Any] = {
        "datasets_file": str(write_datasets_file(run_dir / "datasets.toml", dataset, settings)),
        "name": dataset,
        "target": target,
    }
    state_file, log_file = run_dir / "state.json", run_dir / "steps.log"
    rows: list[dict[str, Any]] = []
    try:
        for phase in PHASES:
            mutation = mutate(tree, images) if phase == "refresh_change" else None
            for step in steps(phase):
                state_file.write_text(json.dumps(state, indent=1))
                print(f"  {target} {label} ({images:,} images): {step} ...", end="", flush=True)
                row = run_step(step, state_file, log_file)
                sub = step.split(".", 1)[1]
                if sub == "scan":
                    state["work"] = row["result"]["manifest_dir"]
                elif sub == "plan":
                    state["plan"] = row["result"]
                    _check_plan(phase, row["result"], mutation)
                elif sub == "ingest":
                    row["bytes_written"] = stored_bytes(row["result"])
                row.update(target=target, size=label, images=images, phase=phase, rows_per_s=_rate(images, row))
                if mutation:
                    row["mutation"] = mutation.counts()
                print(f" {row['wall_s']:.1f} s, peak RSS {peak(row) / 2**20:.0f} MiB ({peak_role(row)})", flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(tree, ignore_errors=True)  # only links and the mutated files: the cached tree is untouched
    return rows


def _rate(images: int, row: dict[str, Any]) -> float:
    return round(images / row["wall_s"], 1) if row["wall_s"] else 0.0


def _check_plan(phase: str, plan: dict[str, Any], mutation: Mutation | None) -> None:
    """The plan of PHASE must say what the benchmark did to the source, else its timings mean nothing."""
    if phase == "refresh_nochange" and plan["changed"]:
        raise RuntimeError(f"refresh without a source change planned a new version: {plan['counts']}")
    if phase != "refresh_nochange" and not plan["changed"]:
        raise RuntimeError(f"{phase}: the plan found no change: {plan['counts']}")
    if mutation and any(plan["counts"][k] != n for k, n in mutation.counts().items()):
        raise RuntimeError(f"{phase}: the plan found {plan['counts']}, the mutation made {mutation.counts()}")


def phase_totals(rows: list[dict[str, Any]], target: str, phase: str) -> list[dict[str, Any]]:
    """Per size of TARGET (by images): PHASE's wall time, its time after the scan and the images it changed."""
    out = []
    for images in sorted({r["images"] for r in rows if r["target"] == target and r.get("phase") == phase}):
        part = [r for r in rows if r["target"] == target and r.get("phase") == phase and r["images"] == images]
        plan = next((r["result"] for r in part if r["step"].endswith(".plan")), {})
        counts = plan.get("counts", {})
        wall = sum(r["wall_s"] for r in part)
        scan = sum(r["wall_s"] for r in part if r["step"].endswith(".scan"))
        changed = sum(int(counts.get(k, 0)) for k in ("added", "changed", "removed"))
        out.append({"images": images, "wall_s": wall, "after_scan_s": wall - scan, "changed": changed})
    return out


def summarize_refresh(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target, for the no-change and the 0.1 % refresh: seconds per changed image at each size, and whether
    the cost after the scan grows with the change rather than with the dataset (see PROPORTIONAL_SLACK)."""
    from imgest.bench.measure import fixed_cost

    out = []
    for target in dict.fromkeys(r["target"] for r in rows if r.get("phase")):
        first = phase_totals(rows, target, "refresh_first")
        for phase in ("refresh_nochange", "refresh_change"):
            points = phase_totals(rows, target, phase)
            if not points:
                continue
            entry: dict[str, Any] = {
                "target": target,
                "phase": phase,
                "images": [p["images"] for p in points],
                "changed": [p["changed"] for p in points],
                "wall_s": [round(p["wall_s"], 2) for p in points],
                "after_scan_s": [round(p["after_scan_s"], 2) for p in points],
                "s_per_changed_image": [
                    round(p["after_scan_s"] / p["changed"], 4) if p["changed"] else None for p in points
                ],
                "first_s_per_image": [round(p["after_scan_s"] / p["images"], 6) for p in first],
                "cost_vs_first": [
                    round(p["after_scan_s"] / f["after_scan_s"], 4) if f["after_scan_s"] else None
                    for p, f in zip(points, first, strict=False)
                ],
            }
            if len(points) >= 2 and len(first) >= 2:
                _, slope = fixed_cost([(p["images"], p["after_scan_s"]) for p in points])
                _, full = fixed_cost([(p["images"], p["after_scan_s"]) for p in first])
                fraction = points[-1]["changed"] / points[-1]["images"]
                ratio = slope / full if full > 0 else None
                entry["marginal_vs_first"] = round(ratio, 4) if ratio is not None else None
                entry["marginal_ms_per_changed_image"] = round(slope / fraction * 1000, 3) if fraction else None
                entry["proportional"] = ratio is not None and ratio <= PROPORTIONAL_SLACK * fraction + BOOKKEEPING
            out.append(entry)
    return out
