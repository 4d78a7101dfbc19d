"""The pack benchmark's datasets: generated images, and larger datasets hard-linked to them under new names
(also the read benchmarks' larger sweep dataset)."""

from __future__ import annotations

import os
from pathlib import Path

from imgest.core import workdir
from imgest.core.paths import state_dir
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest, manifest_metadata
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec

SPEC = TransformSpec()


BASE_IMAGES = 2000  # distinct generated images; larger datasets link to them under new names


CLASSES = 10


def dataset(images: int) -> Path:
    """A scanned ImageFolder dataset of IMAGES train images, cached in the state folder (see the module doc)."""
    root = state_dir() / "bench" / f"pack-{images}"
    manifest = root / "manifest"
    if (manifest / workdir.MANIFEST).is_file():
        return manifest
    base = min(images, BASE_IMAGES)
    base_src = state_dir() / "bench" / f"pack-{base}" / "src"
    if not (base_src / ".complete").is_file():
        write_sample(base_src, SampleSpec("imagefolder", CLASSES, max(1, base // CLASSES), 0, seed=1))
        (base_src / ".complete").touch()
    if images > base:
        link_copies(base_src, root / "src", images)
        scan_to_dir(root / "src", manifest)
    else:
        scan_to_dir(base_src, manifest)
    return manifest


def link_copies(base: Path, out: Path, images: int) -> None:
    """OUT as IMAGES train files: BASE's files, then hard links to them named <stem>_r<k><suffix> (k = 1, 2, ...)."""
    originals = sorted(p for p in base.rglob("*") if p.is_file() and p.name != ".complete")
    made = 0
    for k in range(-(-images // len(originals))):
        for src in originals:
            if made == images:
                return
            dest = out / src.relative_to(base)
            dest = dest.with_name(f"{dest.stem}_r{k}{dest.suffix}") if k else dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                os.link(src, dest)
            made += 1


def manifest_files(manifest: Path) -> tuple[Path, list[tuple[str, int]]]:
    root = Path(manifest_metadata(manifest / workdir.MANIFEST)["root"])
    return root, [(c.rel_path, c.label) for c in iter_manifest(manifest / workdir.MANIFEST)]
