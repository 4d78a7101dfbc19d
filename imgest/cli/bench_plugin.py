"""`imgest bench plugin`: imgest beside cassandra-dali-plugin (registered by imgest.cli.bench)."""

from __future__ import annotations

import argparse
from typing import Any

from imgest.bench.plugin_writers import SIDES  # light: the module imports its heavy parts where it uses them


def bench_plugin_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.plugin import PARTS, main
    from imgest.bench.read_sweep import conditions
    from imgest.cli.common import bench_done
    from imgest.cli.ingest import run_ingest
    from imgest.core.errors import ConfigError
    from imgest.peers.crs4 import INSTALL_HINT, available

    if not available():
        raise ConfigError(f"cassandra-dali-plugin is not installed: {INSTALL_HINT}")
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if parts - set(PARTS) or not parts:
        raise ConfigError(f"--parts {args.parts!r}: choose among {', '.join(PARTS)}")
    sides = tuple(x.strip() for x in args.writers.split(",") if x.strip())
    if set(sides) - set(SIDES):
        raise ConfigError(f"--writers {args.writers!r}: choose among {', '.join(SIDES)}")
    rtts = [float(x) for x in args.rtt.split(",") if x.strip()]
    conds = conditions(rtts, 0, args.jitter, args.limited_rtt) if rtts else []
    report = main(
        args.json,
        args.plot,
        parts,
        images=args.images,
        sweep_images=args.sweep_images,
        rounds=args.rounds,
        epochs=args.epochs,
        conds=conds,
        batch_size=args.batch_size,
        ring_rtts=[float(x) for x in args.ring_rtt.split(",") if x.strip()],
        writer_copies=args.writer_copies,
        writer_sides=sides,
        ingest=run_ingest,
    )
    return bench_done(args, [name for name, met in report["targets"].items() if not met])


def register_plugin(bench_parser: Any) -> None:
    """`imgest bench plugin`, added through BENCH_PARSER (which adds --json and --plot)."""
    bp = bench_parser(
        "plugin",
        help="imgest beside cassandra-dali-plugin: its reader, its writer and its own benchmark (make install-peers)",
        description="Same rows, same server, same DALI pipeline, both sides in the same run. readers: imgest's "
        "Cassandra reader (defaults) and fn.crs4.cassandra (its operator defaults, its examples' settings, its "
        "long-fat-network preset), raw and CPU decode + augment, at 0 ms. sweep: both through Toxiproxy at each "
        "--rtt and a jittery case, --epochs in a row over --sweep-images. loop-read: the plugin's loop_read.py as "
        "shipped on an imgest table beside imgest's reader. writers: its extract_spark.py (spark-submit, "
        "parallelism 10, UNCHANGED) against `imgest ingest cassandra --mode unchanged --verify` on the same tree "
        "at two sizes. ring: the readers on the local three-node ring, every node behind its own proxy, at each "
        "--ring-rtt. Each part records the load and the other processes' CPU; a target is only met on a quiet machine.",
    )
    bp.add_argument(
        "--parts",
        default="readers,sweep,loop-read,writers,ring",
        help="what to run (default all five); a run of some parts into an existing --json updates only those parts",
    )
    bp.add_argument("--images", type=int, default=8000, help="train images of the readers and writers (default 8000)")
    bp.add_argument(
        "--writer-copies",
        type=int,
        default=4,
        help="the writers' tree holds each train image under this many names (hard links), so that start-up "
        "costs weigh as in a long run: 4 x 8000 = 32,000 images by default (1 for the readers' images alone)",
    )
    bp.add_argument(
        "--writers",
        default=",".join(SIDES),
        help="the writers part's writers (the plugin's always runs): imgest = CQL through the Python driver, "
        "imgest-helper = cql-helper (the Java driver in the helper JVM), imgest-bulk = bulk; -header: with "
        f"--unchanged-check header (default all: {','.join(SIDES)})",
    )
    bp.add_argument("--sweep-images", type=int, default=72000, help="images per epoch of the sweep (default 72000)")
    bp.add_argument("--rounds", type=int, default=3, help="rounds; medians reported (default 3)")
    bp.add_argument("--epochs", type=int, default=2, help="epochs in a row per sweep round (default 2)")
    bp.add_argument("--batch-size", type=int, default=64, help="batch size (default 64; divides both sizes)")
    bp.add_argument("--rtt", default="0,10,50,100", help="added round trips of the sweep, ms (default 0,10,50,100)")
    bp.add_argument("--ring-rtt", default="0,50", help="added round trips on the three-node ring, ms (default 0,50)")
    bp.add_argument("--jitter", type=float, default=20, help="+- ms of the jittery case (0 to skip; default 20)")
    bp.add_argument("--limited-rtt", type=float, default=50, help="round trip of the jittery case (default 50)")
    bp.set_defaults(func=bench_plugin_cmd)
