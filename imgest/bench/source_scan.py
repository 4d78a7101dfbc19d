"""`imgest bench source`'s scan part: an ImageFolder prefix of many objects on S3, each scan in a fresh process
(its time and peak RSS)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from imgest.core.paths import state_dir
from imgest.core.settings import S3Settings

log = logging.getLogger(__name__)


SCAN_PER_CLASS = 1000  # objects per class folder of the scan benchmark's tree (ImageNet has about 1,300)


SCAN_BODY = b"\xff\xd8\xff\xe0" + bytes(60)  # what each object holds: a scan lists, it reads no image


# One scan in a fresh process: its RSS once imgest is imported, then the peak over the scan (ru_maxrss, KiB).
_SCAN_CHILD = """
import json, resource, sys, time
from pathlib import Path
from imgest.sources.scan import scan_to_dir
import imgest.sources.s3scan, pyarrow.parquet, boto3
base = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() // 1024
t0 = time.perf_counter()
src = sys.argv[1] if sys.argv[1].startswith("s3://") else Path(sys.argv[1])
report = scan_to_dir(src, Path(sys.argv[2]), "auto", "bench-scan")
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"objects": report.candidates, "seconds": seconds, "base_kib": base, "peak_kib": peak}))
"""


def _scan_tree(objects: int) -> Path:
    """A local ImageFolder tree of OBJECTS tiny files under train/, SCAN_PER_CLASS per class (made once)."""
    from imgest.sources.devdata.sample import synsets

    root = state_dir() / "bench" / "source" / f"scan-{objects}"
    if not (root / ".complete").is_file():
        shutil.rmtree(root, ignore_errors=True)
        wnids = [wnid for wnid, _name in synsets(-(-objects // SCAN_PER_CLASS))]
        for i in range(objects):
            folder = root / "train" / wnids[i // SCAN_PER_CLASS]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{folder.name}_{i}.JPEG").write_bytes(SCAN_BODY)
        (root / ".complete").write_text("")
    return root


def _upload_tree(settings: S3Settings, root: Path, prefix: str) -> str:
    """ROOT's files under s3://imgest-src/PREFIX, 16 PUTs in flight; skipped when a marker says it is complete."""
    client = settings.client(max_pool_connections=16)
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    done = prefix.rstrip("/") + ".complete"  # beside the prefix, not in it (the scan would count it as junk)
    try:
        client.head_object(Bucket=BUCKET, Key=done)
    except client.exceptions.ClientError:
        keys = [(prefix + p.relative_to(root).as_posix(), p) for p in root.rglob("*.JPEG")]
        with ThreadPoolExecutor(16) as pool:
            for _ in pool.map(lambda kp: client.put_object(Bucket=BUCKET, Key=kp[0], Body=kp[1].read_bytes()), keys):
                pass
        client.put_object(Bucket=BUCKET, Key=done, Body=b"")
    return f"s3://{BUCKET}/{prefix}"


def _scan_child(src: Path | str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One scan of SRC into OUT in a fresh process: objects, objects/s, RSS after imports and at its peak (MiB)."""
    import os

    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-c", _SCAN_CHILD, str(src), str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scan of {src} failed: {(proc.stdout + proc.stderr)[-2000:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "objects": doc["objects"],
        "seconds": round(doc["seconds"], 2),
        "objects_per_s": round(doc["objects"] / doc["seconds"]),
        "rss_after_imports_mib": round(doc["base_kib"] / 1024, 1),
        "peak_rss_mib": round(doc["peak_kib"] / 1024, 1),
        "rss_growth_mib": round((doc["peak_kib"] - doc["base_kib"]) / 1024, 1),
    }


def scan_main(counts: tuple[int, ...], rounds: int = 1) -> list[dict[str, Any]]:
    """Scan a prefix of each of COUNTS objects and the same local tree (fresh processes); rows for the report."""
    from imgest.services.s3 import S3Server
    from imgest.sources.s3source import source_env

    settings = S3Server.default().settings()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="imgest-bench-scan-") as tmp:
        for objects in counts:
            root = _scan_tree(objects)
            url = _upload_tree(settings, root, f"bench/source/scan-{objects}/")
            for name, src, env in (("local", root, {}), ("s3", url, source_env(settings))):
                runs = [_scan_child(src, Path(tmp) / f"{name}-{objects}", env) for _ in range(rounds)]
                mid = sorted(runs, key=lambda r: r["objects_per_s"])[len(runs) // 2]  # the median run
                row = {"layout": "imagefolder", "source": name, **mid}
                row["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
                rows.append(row)
                log.info(
                    "scan %s %d objects: %d objects/s, peak RSS %.0f MiB",
                    name,
                    objects,
                    mid["objects_per_s"],
                    row["peak_rss_mib"],
                )
    return rows


BUCKET = "imgest-src"
