"""The `imgest` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgest import __version__
from imgest.errors import ImgestError

log = logging.getLogger("imgest")


def _services_cmd(args: argparse.Namespace) -> int:
    from imgest.services import SERVICE_NAMES, get_service

    names = args.names or list(SERVICE_NAMES)
    if args.action == "up":
        for name in names:
            print(get_service(name).up().message, flush=True)
    elif args.action == "down":
        for name in reversed(names):
            stopped = get_service(name).down()
            print(f"{name}: {'stopped' if stopped else 'was not started by imgest'}")
    else:
        for name in names:
            print(get_service(name).status().line())
    return 0


def _env_cmd(args: argparse.Namespace) -> int:
    from imgest.services import AirflowServer

    server = AirflowServer.default()
    env = server.env()
    for key in ("AIRFLOW_HOME", "IMGEST_HOME", "PATH"):
        print(f"export {key}={env[key]!s}")
    return 0


def _sample_cmd(args: argparse.Namespace) -> int:
    from imgest.sample import SampleSpec, write_sample

    spec = SampleSpec(args.layout, args.classes, args.per_class, args.val_per_class, args.seed, defects=args.defects)
    counts = write_sample(args.out, spec)
    print(
        f"wrote {args.layout} sample to {args.out}: train {counts['train']}, val {counts['val']} images, "
        f"{args.classes} classes (seed {args.seed})"
    )
    return 0


def _scan_cmd(args: argparse.Namespace) -> int:
    from imgest.progress import progress_bar
    from imgest.scan import scan_to_dir

    with progress_bar("scanning", None) as advance:
        report = scan_to_dir(args.src, args.out, args.layout, args.name, args.split, on_candidate=lambda _: advance())
    print(report.summary_line())
    print(f"manifest, class map, quarantine list and report written to {args.out}")
    return 0


def _transform_spec(args: argparse.Namespace) -> Any:
    from imgest.transform import TransformSpec

    return TransformSpec(args.mode, args.resize, args.crop, args.quality, args.max_pixels)


def _check_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.check import CHECK_FILE, check_dataset
    from imgest.progress import progress_bar

    total = json.loads((args.manifest_dir / "scan_report.json").read_text())["kept"]
    with progress_bar("checking", total) as advance:
        report = check_dataset(args.manifest_dir, _transform_spec(args), args.workers, on_progress=advance)
    print(report["summary"])
    print(f"{report['images_per_s']} images/s; details in {args.manifest_dir / CHECK_FILE}")
    return 0


def _add_transform_args(p: argparse.ArgumentParser) -> None:
    from imgest.job_options import TRANSFORM_OPTIONS, add_options

    add_options(p, TRANSFORM_OPTIONS)


def _add_source_args(p: argparse.ArgumentParser) -> None:
    """SRC and how to scan it, and the Spark master: shared by the ingest commands."""
    p.add_argument("src", type=Path, metavar="SRC", help="dataset folder or tar, or a folder holding manifest.parquet")
    p.add_argument("--layout", default="auto", help="dataset layout when SRC must be scanned (default: detected)")
    p.add_argument("--work-dir", type=Path, help="where the scan goes (default .imgest/work/<dataset>)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")


def _manifest_dir(args: argparse.Namespace) -> Path:
    """SRC itself if it holds a manifest, else scan SRC into the work folder first."""
    from imgest.manifest import MANIFEST_FILE
    from imgest.paths import state_dir
    from imgest.scan import scan_to_dir

    if (args.src / MANIFEST_FILE).is_file():
        return args.src
    out = args.work_dir or state_dir() / "work" / (args.dataset or args.src.resolve().name)
    report = scan_to_dir(args.src, out, args.layout, args.dataset)
    print(f"scan: {report.summary_line()}", flush=True)
    return out


def _credentials_env(args: argparse.Namespace) -> None:
    """Put --user / --password-file into the environment the Spark job inherits (never into its argv)."""
    if args.user:
        os.environ["IMGEST_CASSANDRA_USER"] = args.user
    if args.password_file:
        os.environ["IMGEST_CASSANDRA_PASSWORD"] = Path(args.password_file).read_text().strip()


def _ingest_cassandra_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.job_options import CASSANDRA_OPTIONS, TRANSFORM_OPTIONS, forward
    from imgest.spark import run_submit, submit_command

    manifest_dir = _manifest_dir(args)
    _credentials_env(args)
    summary = manifest_dir / "ingest_cassandra.json"
    job_args = [
        "--manifest-dir",
        str(manifest_dir),
        "--summary-json",
        str(summary),
        *forward(args, CASSANDRA_OPTIONS),
        *forward(args, TRANSFORM_OPTIONS),
    ]
    rc = run_submit(submit_command("ingest_cassandra", job_args, args.master))
    if rc != 0:
        print(f"imgest: error: the Spark job failed (exit {rc}); re-running resumes where it stopped", file=sys.stderr)
        return rc
    print(f"summary written to {summary}")
    if args.verify:
        args.manifest_dir, args.version = manifest_dir, json.loads(summary.read_text())["version"]
        return _verify_cassandra_cmd(args)
    return 0


def _s3_env(dest: str) -> None:
    """Give the Spark job S3 credentials through its environment: the user's, else the embedded server's."""
    if not dest.startswith("s3://"):
        return
    from imgest.settings import S3Settings

    settings = S3Settings.from_env()
    if settings.access_key and settings.secret_key:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", settings.access_key)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", settings.secret_key)
    if settings.endpoint_url:
        os.environ.setdefault("IMGEST_S3_ENDPOINT", settings.endpoint_url)


def _ingest_shards_cmd(args: argparse.Namespace) -> int:
    from imgest.job_options import SHARD_OPTIONS, TRANSFORM_OPTIONS, forward
    from imgest.spark import run_submit, submit_command

    manifest_dir = _manifest_dir(args)
    _s3_env(args.dest)
    summary = manifest_dir / "pack_shards.json"
    job_args = [
        "--manifest-dir",
        str(manifest_dir),
        "--dest",
        args.dest,
        "--summary-json",
        str(summary),
        *forward(args, SHARD_OPTIONS),
        *forward(args, TRANSFORM_OPTIONS),
    ]
    rc = run_submit(submit_command("pack_shards", job_args, args.master))
    if rc != 0:
        print(
            f"imgest: error: the Spark job failed (exit {rc}); nothing was published and re-running resumes",
            file=sys.stderr,
        )
        return rc
    print(f"summary written to {summary}")
    return 0


def _verify_cassandra_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.cassandra_client import cassandra_session
    from imgest.cassandra_schema import TableLayout
    from imgest.settings import CassandraSettings
    from imgest.verify_cassandra import verify

    _credentials_env(args)
    env = CassandraSettings.from_env()
    settings = CassandraSettings(
        hosts=tuple(args.hosts.split(",")),
        port=args.port,
        username=env.username,
        password=env.password,
        ssl_ca_file=env.ssl_ca_file,
    )
    tables = TableLayout(args.keyspace, args.table_layout, args.table_suffix)
    with cassandra_session(settings) as session:
        report = verify(session, args.manifest_dir, tables, args.dataset, args.version, args.sample)
    print(json.dumps(report.to_dict(), indent=2))
    if not report.ok:
        print("imgest: error: verification failed; the version is not marked complete", file=sys.stderr)
        return 1
    print(
        f"verified: {sum(report.found.values())} rows match the manifest; {report.sampled} sampled rows are "
        f"byte-equal to a fresh transform; version {report.version} marked complete"
    )
    return 0


def _bench_done(args: argparse.Namespace, missed: list[str]) -> int:
    print(f"JSON written to {args.json}" + (f"; plot {args.plot}" if args.plot else ""))
    if missed:
        print(f"below target: {', '.join(missed)}")
    return 0


def _bench_transform_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.transform import main as bench_main

    report = bench_main(args.json, args.plot, args.images, args.large_images, args.rounds)
    return _bench_done(args, [g["group"] for g in report["groups"] if g["meets_target"] is False])


def _bench_ingest_cassandra_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.ingest_cassandra import main as bench_main

    report = bench_main(args.json, args.plot, args.rows, args.rounds, args.max_in_flight)
    return _bench_done(args, [g["blobs"] for g in report["groups"] if g["meets_target"] is False])


def _bench_pack_cmd(args: argparse.Namespace) -> int:
    from imgest.bench.pack import main as bench_main

    report = bench_main(args.json, args.plot, args.images, args.max_count)
    return _bench_done(args, [] if report["meets_target"] else ["imgest wall time vs 0.5x of the fastest peer"])


def _split_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.split_sources import LabelledRows, from_cassandra, from_shards
    from imgest.splits import SplitFile, make_split, parse_ratios

    ratios = parse_ratios(args.split_ratio)
    if args.metadata_ifn:
        rows = LabelledRows.load(args.metadata_ifn)
    elif args.shards:
        from imgest.shard_store import open_store

        _s3_env(args.shards)
        rows = from_shards(open_store(args.shards), args.split_of)
    else:
        from imgest.cassandra_client import cassandra_session
        from imgest.settings import CassandraSettings

        _credentials_env(args)
        env = CassandraSettings.from_env()
        settings = CassandraSettings(
            hosts=tuple(args.hosts.split(",")),
            port=args.port,
            username=env.username,
            password=env.password,
            ssl_ca_file=env.ssl_ca_file,
        )
        with cassandra_session(settings) as session:
            rows = from_cassandra(session, args.metadata_table, args.data_table, args.split_of)
    if args.metadata_ofn:
        rows.save(args.metadata_ofn)
        print(f"metadata cached in {args.metadata_ofn} ({len(rows.ids)} rows)")
    balance = args.balance
    parts = make_split(rows.labels, ratios, balance, args.seed, rows.num_classes)
    settings = {"ratios": ratios, "balance": balance, "seed": args.seed, "split_of": args.split_of}
    split = SplitFile(rows.ids, rows.labels, parts, rows.num_classes, rows.source, settings)
    split.save(args.split_ofn)
    print(f"split written to {args.split_ofn}")
    if args.format == "crs4":
        crs4 = args.split_ofn.with_suffix(".pckl")
        split.save_crs4(crs4)
        print(f"cassandra-dali-plugin split written to {crs4}")
    summary = split.summary()
    print(json.dumps({"rows": summary["rows"], "parts": summary["parts"], "unused": summary["unused"]}))
    for k, per_class in enumerate(summary["per_class"]):
        print(f"part {k}: " + " ".join(f"{c}:{n}" for c, n in enumerate(per_class)))
    return 0


def _demo_cmd(args: argparse.Namespace) -> int:
    from imgest.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every imgest command."""
    parser = argparse.ArgumentParser(
        prog="imgest",
        description="Turn ImageNet-scale image datasets into training-ready storage "
        "(Cassandra tables or webdataset shards on S3), orchestrated by Airflow, computed by Spark.",
    )
    parser.add_argument("--version", action="version", version=f"imgest {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    services = sub.add_parser(
        "services",
        help="start, stop or inspect the embedded Cassandra, S3 and Airflow",
        description="Embedded services for one machine. State (jars, data, logs, PIDs, AIRFLOW_HOME) "
        "lives in $IMGEST_HOME, by default .imgest/ in the checkout. Ports: IMGEST_CASSANDRA_PORT (9042), "
        "IMGEST_CASSANDRA_STORAGE_PORT (7000), IMGEST_S3_PORT (8333), IMGEST_AIRFLOW_PORT (8080).",
    )
    services_sub = services.add_subparsers(dest="action", metavar="ACTION", required=True)
    helps = {
        "up": "start services (all when none named) and wait until each answers",
        "down": "stop the services that imgest started (by PID)",
        "status": "show each service, its address and whether it answers",
    }
    for action, text in helps.items():
        p = services_sub.add_parser(action, help=text, description=text)
        p.add_argument(
            "names",
            nargs="*",
            metavar="SERVICE",
            help="cassandra, cassandra-auth (PasswordAuthenticator), s3, airflow",
        )
        p.set_defaults(func=_services_cmd)
    env = services_sub.add_parser(
        "env",
        help="print shell exports for using the `airflow` CLI with imgest",
        description='Use as: eval "$(imgest services env)"',
    )
    env.set_defaults(func=_env_cmd)

    sample = sub.add_parser(
        "sample",
        help="write a deterministic photo-like sample dataset",
        description="Generate a dataset in ImageNet's layouts (no downloads needed).",
    )
    sample.add_argument("out", type=Path, metavar="OUT", help="folder to write")
    sample.add_argument(
        "--layout",
        choices=["cls-loc", "imagefolder"],
        default="cls-loc",
        help="cls-loc: ImageNet CLS-LOC with LOC_val_solution.csv; imagefolder: imagenette2 style",
    )
    sample.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    sample.add_argument("--per-class", type=int, default=20, help="train images per class (default 20)")
    sample.add_argument("--val-per-class", type=int, default=5, help="val images per class (default 5)")
    sample.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    sample.add_argument(
        "--defects",
        action="store_true",
        help="also plant broken, awkward and junk files (expected fates in expected_defects.json)",
    )
    sample.set_defaults(func=_sample_cmd)

    scan = sub.add_parser(
        "scan",
        help="list a dataset's images, labels and ids into a Parquet manifest",
        description="Layouts: cls-loc, imagefolder (split folders), flat (class folders), tar "
        "(ImageNet's tar of per-class tars, read in place). Writes OUT/manifest.parquet, "
        "classes.json, quarantine.json (unlabelled files) and scan_report.json.",
    )
    scan.add_argument("src", type=Path, metavar="SRC", help="dataset folder or ILSVRC2012_img_train.tar")
    scan.add_argument("--out", type=Path, required=True, help="folder for the manifest and reports")
    scan.add_argument(
        "--layout", default="auto", choices=["auto", "cls-loc", "imagefolder", "flat", "tar"], help="default: detected"
    )
    scan.add_argument("--name", help="dataset name used in ids (default: the source folder's name)")
    scan.add_argument("--split", default="train", help="split name for flat and tar layouts (default train)")
    scan.set_defaults(func=_scan_cmd)

    check = sub.add_parser(
        "check",
        help="transform every manifest row locally, quarantining bad images",
        description="A dry run of the ingest transform: finds empty, non-image, corrupt and "
        "over-sized files, writes MANIFEST_DIR/check.json, and reconciles the counts.",
    )
    check.add_argument("manifest_dir", type=Path, metavar="MANIFEST_DIR", help="output folder of imgest scan")
    check.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    _add_transform_args(check)
    check.set_defaults(func=_check_cmd)

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
    bt.set_defaults(func=_bench_transform_cmd)
    bc = bench_parser(
        "ingest-cassandra",
        help="rows/s: imgest's writer vs the seed's flush-every-32 pattern",
        description="Same pre-encoded blobs, same Cassandra (IMGEST_CASSANDRA_* or the embedded node), same run.",
    )
    bc.add_argument("--rows", type=int, default=4000, help="rows per writer and round (default 4000)")
    bc.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    bc.add_argument("--max-in-flight", type=int, default=64, help="imgest writer window (default 64)")
    bc.set_defaults(func=_bench_ingest_cassandra_cmd)
    bp = bench_parser(
        "pack",
        help="wall time: imgest shard job vs webdataset ShardWriter and LitData optimize; UNCHANGED vs tar",
        description="Same generated dataset and output for all tools. LitData needs the 'bench' extra (torch).",
    )
    bp.add_argument("--images", type=int, default=2000, help="dataset size (default 2000, generated once)")
    bp.add_argument("--max-count", type=int, default=500, help="samples per shard (default 500)")
    bp.set_defaults(func=_bench_pack_cmd)

    ingest = sub.add_parser(
        "ingest",
        help="run a Spark ingest job (cassandra)",
        description="Scan SRC if needed, then spark-submit the ingest job.",
    )
    ingest_sub = ingest.add_subparsers(dest="target", metavar="TARGET", required=True)
    ic = ingest_sub.add_parser(
        "cassandra",
        help="ingest into Cassandra data/metadata tables",
        description="Idempotent and resumable: ids are deterministic and committed rows with the same source hash "
        "are skipped. Credentials: --user and --password-file, or IMGEST_CASSANDRA_USER / IMGEST_CASSANDRA_PASSWORD.",
    )
    _add_source_args(ic)
    ic.add_argument("--user", help="Cassandra user")
    ic.add_argument("--password-file", help="file holding the Cassandra password")
    ic.add_argument("--verify", action="store_true", help="run imgest verify cassandra afterwards")
    ic.add_argument("--sample", type=int, default=32, help="rows byte-compared by --verify (default 32)")
    from imgest.job_options import CASSANDRA_OPTIONS, add_options

    add_options(ic, CASSANDRA_OPTIONS)
    _add_transform_args(ic)
    ic.set_defaults(func=_ingest_cassandra_cmd)

    ish = ingest_sub.add_parser(
        "shards",
        help="pack webdataset shards (+ DALI .idx) to s3://bucket/prefix or a folder",
        description="Global seeded shuffle, shards cut by --max-count and --max-bytes, named {split}-{index:06d}.tar, "
        "each with a DALI index and a sha256. Shards are staged and published together, manifest.json last. "
        "S3 endpoint and keys: IMGEST_S3_ENDPOINT, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the embedded server.",
    )
    _add_source_args(ish)
    ish.add_argument("--dest", required=True, help="s3://bucket/prefix or a local folder")
    from imgest.job_options import SHARD_OPTIONS

    add_options(ish, SHARD_OPTIONS)
    _add_transform_args(ish)
    ish.set_defaults(func=_ingest_shards_cmd)

    verify = sub.add_parser("verify", help="check stored data against the manifest")
    verify_sub = verify.add_subparsers(dest="target", metavar="TARGET", required=True)
    vc = verify_sub.add_parser(
        "cassandra",
        help="counts per split and label, byte-equal samples, then mark the version complete",
        description="Counts per split and label must equal the manifest minus the quarantine, and a random sample "
        "of rows must be byte-equal to a fresh transform of its source.",
    )
    vc.add_argument("manifest_dir", type=Path, metavar="MANIFEST_DIR")
    vc.add_argument("--version", required=True, help="version printed by the ingest")
    vc.add_argument("--dataset", help="default: from the manifest")
    vc.add_argument("--keyspace", default="imgest")
    vc.add_argument("--table-layout", default="split-column", choices=["split-column", "per-split"])
    vc.add_argument("--table-suffix", default="")
    vc.add_argument("--hosts", default="127.0.0.1")
    vc.add_argument("--port", type=int, default=9042)
    vc.add_argument("--user", help="Cassandra user")
    vc.add_argument("--password-file", help="file holding the Cassandra password")
    vc.add_argument("--sample", type=int, default=32, help="rows to byte-compare (default 32)")
    vc.set_defaults(func=_verify_cassandra_cmd)

    split = sub.add_parser(
        "split",
        help="write a train/val split file (ratios, class balance, seed)",
        description="Rows come from a Cassandra metadata table (default), a published shard dataset (--shards) or a "
        "metadata cache (--metadata-ifn). Balance: each class is scaled so the most constrained class is fully used, "
        "then shuffled with --seed and cut by the ratios with nothing lost to rounding. The safe .npz file is read "
        "with imgest.splits.load_split; --format crs4 also writes the cassandra-dali-plugin dictionary (.pckl).",
    )
    split.add_argument("--data-table", default="imgest.data", help="keyspace.table of the images (default imgest.data)")
    split.add_argument(
        "--metadata-table", default="imgest.metadata", help="keyspace.table of the metadata (default imgest.metadata)"
    )
    split.add_argument("--shards", help="read a published shard dataset instead (s3://bucket/prefix or a folder)")
    split.add_argument("--metadata-ifn", type=Path, help="read rows from this cache instead of the database")
    split.add_argument("--metadata-ofn", type=Path, help="save the rows read to this cache file")
    split.add_argument("--split-of", help="only rows of this original split (e.g. train)")
    split.add_argument("-r", "--split-ratio", default="8,2", help="ratios of the parts (default 8,2)")
    split.add_argument(
        "-b",
        "--balance",
        default="original",
        help="original (every image), random (seeded weights) or one weight per class w0,w1,...",
    )
    split.add_argument("--seed", type=int, default=0, help="same seed, same split (default 0)")
    split.add_argument("-o", "--split-ofn", type=Path, required=True, help="output .npz split file")
    split.add_argument(
        "--format",
        choices=["imgest", "crs4"],
        default="imgest",
        help="crs4: also write the cassandra-dali-plugin pickle beside it (.pckl)",
    )
    split.add_argument("--hosts", default="127.0.0.1")
    split.add_argument("--port", type=int, default=9042)
    split.add_argument("--user", help="Cassandra user")
    split.add_argument("--password-file", help="file holding the Cassandra password")
    split.set_defaults(func=_split_cmd)

    demo = sub.add_parser(
        "demo",
        help="start the embedded services and run the main job on a generated sample",
        description="What the README's first command runs.",
    )
    demo.set_defaults(func=_demo_cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `imgest` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("cassandra", "botocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except ImgestError as exc:
        print(f"imgest: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgest: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
