"""`imgest bench read --check-fidelity`: its flags and its command (imgest.bench.read_fidelity measures)."""

from __future__ import annotations

import argparse
from typing import Any

from imgest.cli.common import bench_done


def register_fidelity(br: Any) -> None:
    """The --check-fidelity flags of `imgest bench read`."""
    br.add_argument(
        "--check-fidelity",
        action="store_true",
        help="instead: the DAG's read-back check against a full read of the same sample without a budget, per "
        "size of ImageNet's count set and target (Cassandra, shards on S3), --rounds rounds; then DALI's s3:// "
        "reader at 1-8 pipelines in parallel beside imgest's stream reader (docs/readback.md, 'The time budget')",
    )
    br.add_argument(
        "--fidelity-sizes",
        default="55k,143k,1.33M",
        help="sizes of the count set for --check-fidelity (default 55k,143k,1.33M; each ingested once, cached)",
    )
    br.add_argument(
        "--fidelity-targets",
        default="cassandra,shards",
        help="targets for --check-fidelity (default cassandra,shards; one alone re-measures its points)",
    )
    br.add_argument(
        "--dali-s3-sample",
        type=int,
        default=2000,
        metavar="N",
        help="--check-fidelity: images (whole shards) DALI's s3:// reader reads per pipeline count (0: skip; 2000)",
    )


def bench_fidelity(args: argparse.Namespace, ingest: Any) -> int:
    """`imgest bench read --check-fidelity`: the DAG's check against a full read, per size and target."""
    from imgest.bench.read_fidelity import SIZES
    from imgest.bench.read_fidelity_run import TARGETS
    from imgest.bench.read_fidelity_run import main as fidelity_main
    from imgest.core.errors import ConfigError

    labels = [x.strip() for x in args.fidelity_sizes.split(",") if x.strip()]
    unknown = [x for x in labels if x not in SIZES]
    if unknown or not labels:
        raise ConfigError(f"--fidelity-sizes {args.fidelity_sizes}: give some of {', '.join(SIZES)}")
    targets = [x.strip() for x in args.fidelity_targets.split(",") if x.strip()]
    if not targets or set(targets) - set(TARGETS):
        raise ConfigError(f"--fidelity-targets {args.fidelity_targets}: give some of {', '.join(TARGETS)}")
    report = fidelity_main(args.json, args.plot, labels, args.rounds, ingest, args.dali_s3_sample, targets)
    unverified = [r["reader"] for s in report["sizes"] for r in s["readers"] if not r["verified"]]
    if unverified:
        print(f"imgest: error: read-back did not match the recorded bytes for {', '.join(sorted(set(unverified)))}")
        return 1
    readers = [(s, r) for s in report["sizes"] for r in s["readers"]]
    missed = [
        f"{s['size']} {s['target']} {r['reader']}/{r['mode']}"
        + ("" if r["check_steady"] else " (no steady rate in the check)")
        for s, r in readers
        if not (r["within"] and r["check_steady"])
    ]
    over = [f"{s['size']} {s['target']} check over its budget" for s in report["sizes"] if not s["within_budget"]]
    return bench_done(args, missed + over)
