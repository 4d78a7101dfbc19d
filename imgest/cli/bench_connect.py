"""`imgest bench connect`: Spark Connect beside spark-submit (registered by imgest.cli.bench)."""

from __future__ import annotations

import argparse
from typing import Any

from imgest.cli.common import bench_done


def register_connect(bench_parser: Any) -> None:
    """`imgest bench connect`, added through BENCH_PARSER (which adds --json and --plot)."""
    bco = bench_parser(
        "connect",
        help="Spark Connect beside spark-submit on one cluster: per-job fixed cost, images/s, and what the "
        "submitting side (an Airflow worker) carries: CPU and peak RSS",
        description="Each size (tiny: 1,000 generated images for the fixed cost; 143k and 1.33M: the count "
        "dataset, generated and scanned once) and target runs once per route, the routes alternating: "
        "spark-submit to the standalone master (the driver JVM on the submitting side), the thin client to the "
        "Connect server, and the same deferrable (the client gone while Spark runs: `worker held s`). Needs "
        "`imgest services up cassandra s3 spark-connect`. 1.33M takes about 90 minutes on 2 "
        "cores.",
    )
    bco.add_argument("--sizes", default="tiny,143k", help="tiny, 143k, 1.33M, comma-separated (default tiny,143k)")
    bco.add_argument("--targets", default="cassandra,shards", help="cassandra, shards (default both)")
    bco.set_defaults(func=bench_connect_cmd)


def bench_connect_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.connect import main as bench_main

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    report = bench_main(args.json, args.plot, sizes, [t.strip() for t in args.targets.split(",") if t.strip()])
    missed = [f"{r['size']} {r['target']} {r['route']}" for r in report["rows"] if r.get("meets_target") is False]
    return bench_done(args, missed)
