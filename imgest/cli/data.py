"""`imgest sample`, `imgest scan`, `imgest check`: datasets before any Spark work."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from imgest.cli.common import add_link_policy_arg, add_transform_args
from imgest.core import workdir


def sample_cmd(args: argparse.Namespace) -> int:
    from imgest.sources.devdata.sample import SampleSpec, write_sample

    spec = SampleSpec(args.layout, args.classes, args.per_class, args.val_per_class, args.seed, defects=args.defects)
    counts = write_sample(args.out, spec)
    print(
        f"wrote {args.layout} sample to {args.out}: train {counts['train']}, val {counts['val']} images, "
        f"{args.classes} classes (seed {args.seed})"
    )
    return 0


def scan_cmd(args: argparse.Namespace) -> int:
    from imgest.core.progress import progress_bar
    from imgest.sources.scan import scan_to_dir

    with progress_bar("scanning", None) as advance:
        report = scan_to_dir(
            args.src,
            args.out,
            args.layout,
            args.name,
            args.split,
            on_candidate=lambda _: advance(),
            follow_external_links=args.follow_external_links,
        )
    print(report.summary_line())
    print(f"manifest, class map, quarantine list and report written to {args.out}")
    return 0


def transform_spec(args: argparse.Namespace) -> Any:
    from imgest.transform.image import TransformSpec

    return TransformSpec.from_args(args)


def check_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.core.progress import progress_bar
    from imgest.transform.check import check_dataset

    total = json.loads((args.manifest_dir / workdir.SCAN_REPORT).read_text())["kept"]
    with progress_bar("checking", total) as advance:
        report = check_dataset(args.manifest_dir, transform_spec(args), args.workers, on_progress=advance)
    print(report["summary"])
    print(f"{report['images_per_s']} images/s; details in {args.manifest_dir / workdir.CHECK_REPORT}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    sample = sub.add_parser(
        "sample",
        help="write a deterministic photo-like sample dataset",
        description="Generate a dataset in ImageNet's layouts (no downloads needed).",
    )
    sample.add_argument("out", type=Path, metavar="OUT", help="folder to write")
    sample.add_argument(
        "--layout",
        choices=["cls-loc", "imagefolder", "tar"],
        default="cls-loc",
        help="cls-loc: ImageNet CLS-LOC with LOC_val_solution.csv; imagefolder: imagenette2 style; tar: "
        "ILSVRC2012_img_train.tar (a tar of per-class tars) + ILSVRC2012_img_val.tar + LOC_val_solution.csv",
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
    sample.set_defaults(func=sample_cmd)

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
    add_link_policy_arg(scan)
    scan.set_defaults(func=scan_cmd)

    check = sub.add_parser(
        "check",
        help="transform every manifest row locally, quarantining bad images",
        description="A dry run of the ingest transform: finds empty, non-image, corrupt and "
        "over-sized files, writes MANIFEST_DIR/check.json, and reconciles the counts.",
    )
    check.add_argument("manifest_dir", type=Path, metavar="MANIFEST_DIR", help="output folder of imgest scan")
    check.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    add_transform_args(check)
    check.set_defaults(func=check_cmd)
