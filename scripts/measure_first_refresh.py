"""Issue #41: the first refresh's baseline step, which hashes every source file when no baseline exists yet.

    PYTHONPATH=<checkout> python scripts/measure_first_refresh.py DIR [--train 19000 --val 1000 --classes 100]

Generates a local dataset of small files (imgest.sources.devdata.countscale) under DIR once, scans it, then times
what ``plan_refresh`` does first on a dataset with no refresh state: ``diff_manifest`` against no baseline, which
reads and hashes every file to write the new baseline's ``src_sha256``. The page cache is warm after the first
round (the files were just written), so the figure is the hashing cost, not the disk's. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def main() -> None:
    from imgest.core import workdir
    from imgest.sources.devdata.countscale import CountScaleSpec, write_count_scale
    from imgest.sources.diff import diff_manifest
    from imgest.sources.manifest import manifest_metadata
    from imgest.sources.scan import scan_to_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--train", type=int, default=19_000)
    p.add_argument("--val", type=int, default=1_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    src, work = args.dir / "src", args.dir / "work"
    if not (work / workdir.MANIFEST).is_file():
        write_count_scale(src, CountScaleSpec(classes=args.classes, train=args.train, val=args.val))
        scan_to_dir(src, work)
    manifest = work / workdir.MANIFEST
    root = Path(manifest_metadata(manifest)["root"])
    seconds = []
    for _ in range(args.rounds):
        t0 = time.monotonic()
        changes = diff_manifest(manifest, None, root, args.dir / "baseline.parquet")
        seconds.append(time.monotonic() - t0)
    row = {
        "images": len(changes.added),
        "baseline_step_s": [round(s, 2) for s in seconds],
        "median_s": round(sorted(seconds)[len(seconds) // 2], 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
