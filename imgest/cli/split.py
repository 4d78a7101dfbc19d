"""`imgest split`: train/val split files."""

from __future__ import annotations

import argparse
from pathlib import Path

from imgest.cli.common import add_cassandra_args, cassandra_settings
from imgest.core.settings import s3_env


def split_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.splits.sources import LabelledRows, from_cassandra, from_shards
    from imgest.splits.split import SplitFile, make_split, parse_ratios

    ratios = parse_ratios(args.split_ratio)
    if args.metadata_ifn:
        rows = LabelledRows.load(args.metadata_ifn)
    elif args.shards:
        from imgest.sinks.shards.store import open_store

        s3_env(args.shards)
        rows = from_shards(open_store(args.shards), args.split_of)
    else:
        from imgest.sinks.cassandra.client import cassandra_session

        settings = cassandra_settings(args)
        with cassandra_session(settings) as session:
            rows = from_cassandra(
                session, args.metadata_table, args.data_table, args.split_of, args.dataset, args.version
            )
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


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    split = sub.add_parser(
        "split",
        help="write a train/val split file (ratios, class balance, seed)",
        description="Rows come from a Cassandra metadata table (default), a published shard dataset (--shards) or a "
        "metadata cache (--metadata-ifn). Balance: each class is scaled so the most constrained class is fully used, "
        "then shuffled with --seed and cut by the ratios with nothing lost to rounding. The safe .npz file is read "
        "with imgest.splits.split.load_split; --format crs4 also writes the cassandra-dali-plugin dictionary (.pckl).",
    )
    split.add_argument("--data-table", default="imgest.data", help="keyspace.table of the images (default imgest.data)")
    split.add_argument(
        "--metadata-table", default="imgest.metadata", help="keyspace.table of the metadata (default imgest.metadata)"
    )
    split.add_argument("--dataset", help="dataset whose rows to split (needed when the table holds several)")
    split.add_argument("--version", help="version of the dataset (default: its complete one in the table)")
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
    add_cassandra_args(split)
    split.set_defaults(func=split_cmd)
