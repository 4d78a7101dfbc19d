"""`imgest validate`: read a stored dataset back with several engines and check every byte."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from imgest.core import defaults


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give 0 (every file) or a sample size")
    return value


def validate_xnvme_cmd(args: argparse.Namespace) -> int:
    from imgest.core.progress import progress_bar
    from imgest.validate.check import CheckConfig
    from imgest.validate.dataset import planned_images
    from imgest.validate.report import summary_text
    from imgest.validate.step import validate_xnvme_step

    cfg = CheckConfig(
        batch_size=args.batch_size,
        queue_depth=args.queue_depth,
        file_queue_depth=args.file_queue_depth,
        rounds=args.rounds,
        decode=args.decode,
        engines=tuple(args.engines.split(",")),
        splits=tuple(args.split) if args.split else None,
        sample=args.sample,
        seed=args.seed,
        cold=args.cold,
    )
    images = planned_images(args.dataset_dir, list(cfg.splits) if cfg.splits else None, cfg.sample)
    passes = len(cfg.engines) * (1 + cfg.rounds) + (2 * len(args.sweep) * max(1, cfg.rounds) if args.sweep else 0)
    out = args.out or args.dataset_dir.parent / f"{args.dataset_dir.name}-validate"
    with progress_bar("validate xnvme", images * (passes + 1)) as advance:
        summary = validate_xnvme_step(
            args.dataset_dir,
            out,
            config=cfg,
            loop_fs=None if args.loop_fs == "none" else args.loop_fs,
            sweep=args.sweep,
            advance=advance,
            json_path=args.json,
            plot_path=args.plot,
        )
    print(summary_text(json.loads(Path(summary["report"]).read_text())))
    print(f"report {summary['report']}; plot {summary['plot']}; all engines byte-exact: {summary['ok']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    validate = sub.add_parser("validate", help="read stored data back with several engines and check every byte")
    validate_sub = validate.add_subparsers(dest="check", metavar="CHECK", required=True)
    vx = validate_sub.add_parser(
        "xnvme",
        help="DALI's file reader vs external_source fed by the Python file API, xNVMe's file API and xNVMe's "
        "block API (LBA reads from a FIEMAP block map): sha256 and labels of every sample, img/s and MB/s",
        description="Every engine feeds the same DALI pipeline at the same batch size. Fails (exit 1) when any "
        "engine reads a byte or label that differs from the ingest record; engines this machine cannot run are "
        "skipped with the reason.",
    )
    vx.add_argument("dataset_dir", type=Path, metavar="DATASET_DIR", help="a published files dataset")
    vx.add_argument("--out", type=Path, help="where the report, plot and block map go (default DATASET_DIR-validate)")
    vx.add_argument("--json", type=Path, help=f"report path (default OUT/{'validate_xnvme.json'})")
    vx.add_argument("--plot", type=Path, help="plot path (default OUT/validate_xnvme.png)")
    vx.add_argument("--split", action="append", help="only this split (repeatable; default all)")
    vx.add_argument(
        "--sample",
        type=_count,
        default=defaults.CHECK_SAMPLE,
        metavar="N",
        help=f"images read per split: a seeded, class-balanced sample (default {defaults.CHECK_SAMPLE}); "
        "0 reads every file (at ImageNet's count: hours)",
    )
    vx.add_argument(
        "--seed", type=int, default=defaults.CHECK_SAMPLE_SEED, help="the sample's seed (same seed, same images)"
    )
    vx.add_argument("--engines", default=",".join(defaults.XNVME_ENGINES), help="comma-separated (default all four)")
    vx.add_argument("--batch-size", type=int, default=defaults.XNVME_BATCH_SIZE)
    vx.add_argument("--queue-depth", type=int, default=defaults.XNVME_QUEUE_DEPTH, help="block engine reads in flight")
    vx.add_argument(
        "--file-queue-depth", type=int, default=defaults.XNVME_FILE_QUEUE_DEPTH, help="file engine pieces in flight"
    )
    vx.add_argument("--rounds", type=int, default=defaults.XNVME_ROUNDS, help="timed passes per engine (median)")
    vx.add_argument("--decode", action="store_true", help="also decode and resize in the pipeline")
    vx.add_argument(
        "--loop-fs",
        choices=["none", "ext4", "xfs"],
        default="none",
        help="check a copy on a fresh loop-mounted filesystem (needs root) instead of DATASET_DIR in place",
    )
    vx.add_argument(
        "--cold",
        action="store_true",
        help="drop the checked images' pages from the page cache before every timed pass (posix_fadvise; with "
        "--loop-fs the loop image's too), so the device answers, not memory (default: warm, from the cache)",
    )
    vx.add_argument("--sweep", type=_ints, help="queue depths to sweep for the xNVMe engines, e.g. 1,2,4,8,16,32,64")
    vx.set_defaults(func=validate_xnvme_cmd)
