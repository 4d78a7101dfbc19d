"""`imgest bench`: benchmarks that compare against a baseline in the same run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from imgest.cli.common import bench_done
from imgest.core import defaults


def bench_transform_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.transform import main as bench_main

    if args.peers:
        return bench_transform_peers(args)
    report = bench_main(
        args.json, args.plot, args.images, args.large_images, args.rounds, args.source or None, args.generated
    )
    missed = [g["group"] for g in report["groups"] if g.get("meets_target") is False]
    missed += [f"{g['group']} (quality)" for g in report["groups"] if g.get("meets_quality_target") is False]
    return bench_done(args, missed)


def bench_transform_peers(args: argparse.Namespace) -> int:
    from imgest.bench import transform_peers_report, transform_real

    sources = args.source or [s for s in [transform_real.default_real_set()] if s.is_dir()]
    images, large = (args.images, args.large_images) if args.generated else (0, 0)
    report = transform_peers_report.main(args.json, args.plot, images, large, args.rounds, sources)
    missed = [g["group"] for g in report["groups"] if g.get("meets_target") is False]
    return bench_done(args, missed)


def bench_ingest_cassandra_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.ingest_cassandra import main as bench_main

    report = bench_main(args.json, args.plot, args.rows, args.rounds, args.max_in_flight)
    return bench_done(args, [g["blobs"] for g in report["groups"] if g["meets_target"] is False])


def bench_pack_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.pack import main as bench_main

    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    report = bench_main(args.json, args.plot, sizes, args.rounds, args.max_count)
    missed = [f"{name} (at the largest size)" for name, t in report["targets"].items() if not t["met_at_largest"]]
    missed += [f"{name} (per image)" for name, t in report["targets"].items() if not t["met_per_image"]]
    return bench_done(args, missed)


def bench_read_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.read import main as bench_main
    from imgest.cli.ingest import run_ingest

    if args.check_fidelity:
        from imgest.cli.bench_fidelity import bench_fidelity

        return bench_fidelity(args, run_ingest)

    if args.sample < 0 or args.check_seconds < 0:
        from imgest.core.errors import ConfigError

        what = f"--sample {args.sample}" if args.sample < 0 else f"--check-seconds {args.check_seconds}"
        raise ConfigError(f"{what}: give 0 (every row; no budget) or more")
    from imgest.bench.read_sweep import conditions

    rtts = [float(x) for x in args.rtt.split(",") if x.strip()] if args.rtt else []
    depths = [int(x) for x in args.depths.split(",") if x.strip()]
    conds = conditions(rtts, args.bandwidth_mb, args.jitter, args.limited_rtt) if rtts else []
    from imgest.bench.read_sweep import PLUGIN, SWEPT

    unknown = [r for r in args.sweep_readers.split(",") if r.strip() and r.strip() not in (*SWEPT, *PLUGIN)]
    if unknown:
        from imgest.core.errors import ConfigError

        raise ConfigError(f"--sweep-readers: {', '.join(unknown)} not among {', '.join((*SWEPT, *PLUGIN))}")
    if args.epochs < 1:
        from imgest.core.errors import ConfigError

        raise ConfigError(f"--epochs {args.epochs}: give 1 or more")
    report = bench_main(
        args.json,
        args.plot,
        args.images,
        args.rounds,
        conds,
        depths,
        args.batch_size,
        args.sample,
        args.sweep_only,
        epochs=args.epochs,
        sweep_images=args.sweep_images,
        readers=tuple(r.strip() for r in args.sweep_readers.split(",") if r.strip()),
        ingest=run_ingest,
        check_seconds=args.check_seconds,
    )
    unverified = [f"{r['reader']}/{r['mode']}" for r in report["readers"] if not r["verified"]]
    if unverified:
        print(f"imgest: error: read-back did not match the recorded bytes for {', '.join(unverified)}")
        return 1
    return bench_done(args, [])


def bench_cluster_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.cluster import main as bench_main

    bench_main(args.json, args.plot, args.images, args.rounds, args.max_count)
    return bench_done(args, [])


def bench_scale_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.scale import main as bench_main

    fractions = [float(x) for x in args.fractions.split(",") if x.strip()]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.dag:
        from imgest.bench.scale_dag import main as dag_main

        report = dag_main(args.json, args.plot, fractions, targets)
        return bench_done(args, [f"{r['target']}/{r['size']} (failed)" for r in report["runs"] if not r["ok"]])
    report = bench_main(args.json, args.plot, args.dataset, fractions, targets, refresh=args.refresh)
    missed = [
        f"{s['target']}/{s['step']} ({'time' if not s['time_met'] else 'memory'})"
        for s in report["summary"]
        if s.get("time_met") is False or s.get("rss_met") is False
    ]
    missed += [
        f"{s['target']}/{s['phase']} (not proportional to the change)"
        for s in report.get("refresh", [])
        if s.get("proportional") is False
    ]
    return bench_done(args, missed)


def register_scale(bench_parser: Any) -> None:
    """`imgest bench scale`, added through BENCH_PARSER (which adds --json and --plot)."""
    bs = bench_parser(
        "scale",
        help="every step of ingest_imagenet at 1 %%, 10 %% and 100 %% of ImageNet's count (or bytes): time, memory",
        description="Runs the DAG's steps (scan, prepare, ingest, verify, split, read-back) for each target and size, "
        "each step in its own process, calling the function the DAG's task calls; records wall time, peak RSS of "
        "the step process, the Spark driver and the largest Spark Python worker, images/s and bytes written. "
        "Targets: time(100 %) / time(10 %) <= 11 per step, peak RSS <= 2 GiB and RSS(100 %) / RSS(10 %) <= 1.5. "
        "--dataset count: 1,281,167 + 50,000 small JPEGs in 1,000 classes (generated once into "
        "$IMGEST_HOME/bench/count-scale, about 1.4 GB and 3 minutes on 2 cores); bytes: 100,000 ImageNet-size "
        "images (2,000 distinct, hard-linked); count21k: ImageNet-21k's 21,841 classes at the same 1,331,167 images, "
        "one tar of class tars per size on the S3 source bucket (generated into $IMGEST_HOME/bench/count21k, about "
        "2.6 GB, and uploaded once). Needs Cassandra and S3 (imgest services up cassandra s3). The full "
        "count run takes hours on 2 cores: try --fractions 0.01,0.1 first.",
    )
    bs.add_argument(
        "--dataset", choices=("count", "count21k", "bytes"), default="count", help="which dataset (default count)"
    )
    bs.add_argument("--fractions", default="0.01,0.1,1", help="sizes as fractions of it (default 0.01,0.1,1)")
    bs.add_argument(
        "--targets",
        default="cassandra,shards",
        help="targets, comma-separated: cassandra (the CQL write path), cassandra-bulk (the bulk loader), shards "
        "(default cassandra,shards)",
    )
    bs.add_argument(
        "--refresh",
        action="store_true",
        help="measure the refresh_<name> DAG's path instead (scan, plan, prepare, ingest, finish): a first version, "
        "a refresh without change and one after a seeded 0.1 %% change (a third changed, added, removed) of a "
        "private hard-linked copy of each size; reports seconds per changed image and whether the cost follows the "
        "change",
    )
    bs.add_argument(
        "--dag",
        action="store_true",
        help="run the whole ingest_imagenet DAG through Airflow (airflow dags test) per target and size instead, "
        "the tasks back to back as a user's run has them; records each task's time, the Cassandra node's peak heap "
        "and direct memory (JMX), its SSTables after the load and the read-back share (count dataset; targets "
        "cassandra (write path auto), cassandra-cql, cassandra-bulk, shards)",
    )
    bs.set_defaults(func=bench_scale_cmd)


def register_cluster(bench_parser: Any) -> None:
    """`imgest bench cluster`, added through BENCH_PARSER (which adds --json and --plot)."""
    bcl = bench_parser(
        "cluster",
        help="the cost of the cluster path: the shard job on local[N] vs the Spark standalone cluster, same N cores",
        description="Same generated dataset, same job (pack_shards into a folder), same total cores (the cluster's "
        "workers x cores); spark-submit wall time and in-job time, median of --rounds with min and max. Starts the "
        "standalone cluster (`imgest services up spark`) if it is not running, and stops it afterwards.",
    )
    bcl.add_argument("--images", type=int, default=1000, help="dataset size (default 1000, generated once)")
    bcl.add_argument("--rounds", type=int, default=3, help="rounds per master; medians reported (default 3)")
    bcl.add_argument("--max-count", type=int, default=100, help="samples per shard (default 100)")
    bcl.set_defaults(func=bench_cluster_cmd)


def bench_source_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.source import main as bench_main

    rtts = tuple(float(x) for x in args.rtt.split(",") if x.strip())
    layouts = tuple(x.strip() for x in args.layouts.split(",") if x.strip())
    scan_objects = tuple(int(x) for x in args.scan_objects.split(",") if x.strip())
    report = bench_main(args.json, args.images, args.rounds, rtts, args.master, args.plot, layouts, scan_objects)
    return bench_done(
        args, [f"{r['layout']} {r['source']}" for r in report["ingest"] if r.get("meets_target") is False]
    )


def register_source(bench_parser: Any) -> None:
    """`imgest bench source`, added through BENCH_PARSER (which adds --json and --plot)."""
    bsrc = bench_parser(
        "source",
        help="ingest images/s from a local source vs the same dataset on S3 (0 ms and added RTT through Toxiproxy)",
        description="Same generated dataset (ImageFolder and ImageNet's tars), same files job and cores; the S3 copy "
        "is read through a Toxiproxy proxy with each --rtt added. Reports in-job images/s, the ratio to the local "
        "source (target >= 0.9) and scan objects/s. Needs S3 (imgest services up s3) and toxiproxy-server.",
    )
    bsrc.add_argument("--images", type=int, default=2000, help="train images per layout (default 2000)")
    bsrc.add_argument("--rounds", type=int, default=3, help="runs per condition; medians reported (default 3)")
    bsrc.add_argument("--rtt", default="0,10", help="added round trips in ms, comma-separated (default 0,10)")
    bsrc.add_argument("--master", default="", help="Spark master (default local[<cores>])")
    bsrc.add_argument(
        "--layouts", default="imagefolder,tar", help="layouts ingested (default imagefolder,tar; '' for none)"
    )
    bsrc.add_argument(
        "--scan-objects",
        default="",
        help="also scan an ImageFolder prefix of each of these object counts (e.g. 100000) and the same local tree, "
        "each in a fresh process: objects/s and peak RSS. With --layouts '' only this runs and the JSON's other "
        "figures are kept",
    )
    bsrc.set_defaults(func=bench_source_cmd)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    bench = sub.add_parser(
        "bench",
        help="benchmarks against a baseline in the same run (figures + JSON)",
        description="Each benchmark prints a table and writes JSON; none asserts on time.",
    )
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)

    def bench_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        p = bench_sub.add_parser(name, **kwargs)
        p.add_argument("--json", type=Path, required=True, help="where to write the JSON report")
        p.add_argument("--plot", type=Path, help="also save a bar chart PNG here")
        p.set_defaults(embedded=True)  # benchmarks run on the embedded services they start (services env's settings)
        return p

    bt = bench_parser(
        "transform",
        help="images/s per core: imgest transform vs a plain Pillow pipeline",
        description="Same generated images, same run, one core; PSNR against a "
        "full-precision reference shows the output quality of both.",
    )
    bt.add_argument("--images", type=int, default=150, help="ImageNet-size sources (default 150)")
    bt.add_argument("--large-images", type=int, default=12, help="sources of 3-8 megapixels (default 12)")
    bt.add_argument("--rounds", type=int, default=3, help="timed passes; the median is reported (default 3)")
    bt.add_argument(
        "--source",
        type=Path,
        action="append",
        help="a folder of real files to time and judge image by image (repeatable; default: the real-photo set "
        "scripts/real_photos.py builds in .imgest/bench/real-photos, when present)",
    )
    bt.add_argument(
        "--generated",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the generated photo-like images (default: yes)",
    )
    bt.add_argument(
        "--peers",
        action="store_true",
        help="instead: imgest against the peers practitioners use (Pillow draft, OpenCV reduced decode, simplejpeg, "
        "pillow-simd when make install-pillow-simd built it), per group: baseline, progressive, grey, CMYK, >= 2 MP",
    )
    bt.set_defaults(func=bench_transform_cmd)
    bc = bench_parser(
        "ingest-cassandra",
        help="rows/s: imgest's writer vs the seed's flush-every-32 pattern",
        description="Same pre-encoded blobs, same Cassandra (IMGEST_CASSANDRA_* or the embedded node), same run.",
    )
    bc.add_argument("--rows", type=int, default=4000, help="rows per writer and round (default 4000)")
    bc.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    bc.add_argument("--max-in-flight", type=int, default=64, help="imgest writer window (default 64)")
    bc.set_defaults(func=bench_ingest_cassandra_cmd)
    bp = bench_parser(
        "pack",
        help="wall time: imgest shard job vs webdataset ShardWriter and LitData optimize; UNCHANGED vs tar",
        description="Equal work for every tool: the same generated dataset, members (.jpg/.cls/.json), seeded order "
        "and number of cores (a ShardWriter process pool, LitData workers = Spark's local[*] slots). Peers run "
        "with their natural Pillow transform and with imgest's. Every tool runs at each --sizes for --rounds "
        "(median, min, max); a line fit splits fixed start-up from per-image cost. UNCHANGED packing (decode "
        "and header check) against tar. LitData needs the 'bench' extra (make install-bench). The default "
        "sweep takes about 20 minutes on 2 cores.",
    )
    bp.add_argument(
        "--sizes", default="2000,8000,20000", help="dataset sizes, comma-separated (default 2000,8000,20000)"
    )
    bp.add_argument("--rounds", type=int, default=3, help="rounds per size; medians reported (default 3)")
    bp.add_argument("--max-count", type=int, default=500, help="samples per shard (default 500)")
    bp.set_defaults(func=bench_pack_cmd)

    br = bench_parser(
        "read",
        help="DALI read throughput: Cassandra, shards (folder, S3), files; latency hiding through a TCP proxy",
        description="Stores one generated dataset three ways with the project's jobs (cached), then reads the same "
        "train rows with every reader through the same DALI pipeline (raw bytes, and decode + random resized crop + "
        "flip + normalize on CPU), servers pinned to one core and the reader to the other. Every sample is hashed "
        "against its sha256 recorded at ingest. Every figure is the epoch rate (harmonic mean of batch rates), median "
        "of --rounds, with CPU cores per 1,000 images/s. --rtt adds round trips through Toxiproxy (make install-dev "
        "builds it), then a bandwidth-limited and a jittery case; the readers run with their default (adaptive) "
        "window, and with fixed --depths (prefetch buffers / shards in flight) when given.",
    )
    br.add_argument("--images", type=int, default=4000, help="train images (default 4000, stored once)")
    br.add_argument("--rounds", type=int, default=3, help="timed rounds; medians reported (default 3)")
    br.add_argument("--batch-size", type=int, default=64, help="batch size of every pipeline (default 64)")
    br.add_argument("--rtt", default="0,10,50,100", help="added round trips in ms for the sweep ('' to skip)")
    br.add_argument(
        "--depths", default="", help="fixed prefetch buffers / shards in flight to sweep beside the adaptive default"
    )
    br.add_argument(
        "--bandwidth-mb",
        type=float,
        default=50,
        help="MB/s per TCP connection of the bandwidth-limited case (0 to skip; default 50)",
    )
    br.add_argument("--jitter", type=float, default=40, help="+- ms of the jittery case (0 to skip; default 40)")
    br.add_argument(
        "--limited-rtt", type=float, default=50, help="added round trip of the bandwidth and jitter cases (default 50)"
    )
    br.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="epochs in a row per round of the adaptive readers in the sweep; each is reported, and all together "
        "(default 3)",
    )
    br.add_argument(
        "--sweep-images",
        type=int,
        default=0,
        metavar="N",
        help="the adaptive readers of the sweep read N images per epoch: --images' sources hard-linked under new "
        "names, stored on S3 and in Cassandra only (cached); 0 or <= --images: the --images set (default 0)",
    )
    br.add_argument(
        "--sweep-readers",
        default="cassandra,shards-s3-stream,cassandra-simple,shards-s3-webdataset",
        help="the readers of the network sweep, comma-separated (default: these four; also crs4-plugin-defaults, "
        "crs4-plugin-examples, crs4-plugin-lfn: cassandra-dali-plugin's reader, make install-peers)",
    )
    br.add_argument(
        "--sweep-only",
        action="store_true",
        help="only the network sweep (docs/bench/read-latency.json), not the readers table",
    )
    br.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="read a seeded, class-balanced sample of N train images (shards: whole shards holding about N); "
        "0 = every row (the default, so every reader reads the same images)",
    )
    br.add_argument(
        "--check-seconds",
        type=float,
        default=0,
        metavar="S",
        help="read each round within S seconds, as the DAG's read_throughput check does (each reader its "
        f"{defaults.CHECK_WARMUP_BATCHES} warm-up and {defaults.CHECK_WINDOW_BATCHES} measured batches, then on until "
        "its rate is steady or its share is spent; the PyTorch datasets read "
        f"everything); 0 = no budget (the default; the DAG's is {defaults.CHECK_SECONDS})",
    )
    from imgest.cli.bench_fidelity import register_fidelity

    register_fidelity(br)
    br.set_defaults(func=bench_read_cmd)

    from imgest.cli.bench_plugin import register_plugin

    register_plugin(bench_parser)
    register_cluster(bench_parser)
    from imgest.cli.bench_connect import register_connect

    register_connect(bench_parser)
    register_scale(bench_parser)
    register_source(bench_parser)
