"""Scanning a local dataset tree (or ImageNet's tar of tars) into candidates with labels and ids.

Layouts:
- ``cls-loc``: ImageNet CLS-LOC. ``train/<wnid>/*.JPEG``; flat ``val/`` labelled by ``LOC_val_solution.csv``;
  class names from ``LOC_synset_mapping.txt``. The Kaggle tree (``ILSVRC/Data/CLS-LOC/``) is found too.
- ``imagefolder``: split folders holding class folders (imagenette2-320: ``train/<class>/``, ``val/<class>/``).
- ``flat``: class folders directly under the root, one split (``--split``, default train).
- ``tar``: ImageNet's archives, read in place by offset, never unpacked: ``ILSVRC2012_img_train.tar`` (a tar
  holding one ``<wnid>.tar`` per class; split ``--split``, default train) and, when it lies in the same folder,
  ``ILSVRC2012_img_val.tar`` (a flat tar of images; split val) labelled by the first wnid of each row of the
  ``LOC_val_solution.csv`` in that folder. The source is that folder or the train tar itself.

Labels: the index of the class folder in sorted order over all splits, one mapping for every split, which is
what DALI ``fn.readers.file`` assigns when every split has every class.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from imgest.core.errors import ConfigError
from imgest.core.quarantine import QuarantineEntry, Reason
from imgest.sources.manifest import Candidate, ClassInfo, image_id
from imgest.sources.scanbase import CLS_LOC_SPLITS, LAYOUTS, SPLIT_NAMES, ScanReport, junk_kind
from imgest.sources.tarsource import (
    TRAIN_TAR,
    FlatTar,
    ImageNetTars,
    TarOfTars,
    imagenet_tars,
    no_solution_hint,
)
from imgest.sources.tree import TreeWalker
from imgest.sources.valsolution import VAL_SOLUTION, read_val_solution


def detect_layout(src: Path) -> str:
    """Guess the layout of SRC (see the module docstring)."""
    if src.is_file():
        if tarfile.is_tarfile(src):
            return "tar"
        raise ConfigError(f"{src} is a file but not a tar archive; point imgest at a folder or an ImageNet tar")
    if not src.is_dir():
        raise ConfigError(f"dataset source {src} does not exist")
    if (src / "ILSVRC" / "Data" / "CLS-LOC").is_dir():
        return "cls-loc"
    if (src / TRAIN_TAR).is_file() and not any((src / name).is_dir() for name in SPLIT_NAMES):
        return "tar"  # ImageNet's archives (an unpacked tree beside them wins)
    if (src / VAL_SOLUTION).is_file():
        return "cls-loc"
    if any((src / name).is_dir() for name in SPLIT_NAMES):
        return "imagefolder"
    return "flat"


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link loop (ELOOP): the walk reports it
        return False


def _sorted_dirs(path: Path) -> list[str]:
    with os.scandir(path) as it:
        return sorted(e.name for e in it if _is_dir(e) and not e.name.startswith("."))


class Scanner:
    """Streams the candidates of one dataset; fills ``report`` as it goes."""

    def __init__(
        self,
        src: Path,
        layout: str = "auto",
        dataset: str | None = None,
        flat_split: str = "train",
        follow_external_links: bool = False,
    ) -> None:
        self.src = src.resolve()
        self.layout = detect_layout(self.src) if layout == "auto" else layout
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown layout {layout!r}; choose from auto, {', '.join(LAYOUTS)}")
        self.dataset = dataset or self.src.name.split(".")[0]
        self.flat_split = flat_split
        self.report = ScanReport(self.dataset, self.layout, str(self.src))
        self._walker = TreeWalker(self.src, self.report.skipped, follow_external_links, junk_kind, self._junk)
        self._tars: ImageNetTars | None = imagenet_tars(self.src) if self.layout == "tar" else None
        self._tar = TarOfTars(self._tars.train if self._tars else self.src, self.report.skipped, junk_kind, self._junk)
        if self._tars and self._tars.val and flat_split == "val":
            raise ConfigError(
                f"split 'val' was asked for the train tar {self._tars.train.name}, but {self._tars.val} is scanned as "
                "split val: choose another --split or move the val tar"
            )
        self._root = self._data_root()
        self.report.classes = self._classes()
        self._label = {c.wnid: c.index for c in self.report.classes}

    # ---- layout specifics -------------------------------------------------------------------------------
    def _data_root(self) -> Path:
        if self._tars is not None:
            return self._tars.folder
        if self.layout == "cls-loc" and (self.src / "ILSVRC" / "Data" / "CLS-LOC").is_dir():
            return self.src / "ILSVRC" / "Data" / "CLS-LOC"
        return self.src

    def splits(self) -> list[str]:
        """The splits this scan reads, in order."""
        if self.layout == "cls-loc":
            return [s for s in CLS_LOC_SPLITS if (self._root / s).is_dir()]
        if self.layout == "imagefolder":
            return [s for s in _sorted_dirs(self._root) if s in SPLIT_NAMES]
        if self._tars is not None and self._tars.val is not None:
            return [self.flat_split, "val"]
        return [self.flat_split]

    def _class_dirs(self, split: str) -> list[str]:
        if self.layout == "cls-loc":
            return _sorted_dirs(self._root / split) if split == "train" else []
        if self.layout == "imagefolder":
            return _sorted_dirs(self._root / split)
        return _sorted_dirs(self._root)

    def _classes(self) -> list[ClassInfo]:
        if self.layout == "tar":
            wnids = self._tar.class_names()
        else:
            per_split = {s: set(self._class_dirs(s)) for s in self.splits()}
            wnids = sorted(set().union(*per_split.values())) if per_split else []
            for split, present in per_split.items():
                if present and present != set(wnids):
                    self.report.warnings.append(
                        f"split {split!r} lacks {len(set(wnids) - present)} classes; labels follow the union of "
                        "all splits, so DALI fn.readers.file on that split alone would number classes differently"
                    )
        if not wnids:
            raise ConfigError(f"no class folders found in {self._root} (layout {self.layout})")
        names = self._synset_names()
        return [ClassInfo(i, w, names.get(w, "")) for i, w in enumerate(wnids)]

    def _find(self, filename: str) -> Path | None:
        for folder in (self.src, self._root, self.src.parent):
            if (folder / filename).is_file():
                return folder / filename
        return None

    def _synset_names(self) -> dict[str, str]:
        path = self._find("LOC_synset_mapping.txt")
        if path is None:
            return {}
        names = {}
        for line in path.read_text().splitlines():
            wnid, _, name = line.strip().partition(" ")
            if wnid:
                names[wnid] = name
        return names

    def _val_labels(self, path: Path | None, missing: str) -> dict[str, str]:
        """Image id -> wnid from the label file PATH (None: MISSING is warned and every val image is unlabelled)."""
        if path is None:
            self.report.warnings.append(f"{missing}: flat val images have no labels (each is quarantined as no-label)")
            return {}
        return read_val_solution(path)

    def _val_wnid(self, labels: dict[str, str], rel: str, stem: str) -> str | None:
        """The train class of flat val image REL, or None once it is quarantined for want of one."""
        wnid = labels.get(stem)
        if wnid is None:
            self._quarantine_no_label("val", rel, f"no row in {VAL_SOLUTION}")
        elif wnid not in self._label:
            self._quarantine_no_label("val", rel, f"label {wnid} in {VAL_SOLUTION} is not a train class")
        else:
            return wnid
        return None

    def _record_rows_without_file(self, labels: dict[str, str], seen: set[str], where: str) -> None:
        self.report.missing_files = sorted(set(labels) - seen)
        if self.report.missing_files:
            self.report.warnings.append(
                f"{len(self.report.missing_files)} rows of {VAL_SOLUTION} name no image in {where}; they are listed "
                "under label_rows_without_file in the scan report"
            )

    # ---- candidates -------------------------------------------------------------------------------------
    def candidates(self) -> Iterator[Candidate]:
        """Every candidate image with its label; junk, skipped links and unlabelled files go to the report."""
        yield from self._tar_candidates(self._tars) if self._tars is not None else self._folder_candidates()
        for cls in self.report.empty_classes():
            self.report.warnings.append(
                f"class {cls.wnid!r} has no image; its label {cls.index} is kept (labels are the sorted position "
                "of every class folder, as DALI fn.readers.file assigns them)"
            )

    def _junk(self, kind: str) -> None:
        self.report.junk[kind] += 1

    def _folder_candidates(self) -> Iterator[Candidate]:
        splits = self.splits()
        labels: dict[str, str] = {}  # read first: a malformed label file fails before any image is listed
        if self.layout == "cls-loc" and "val" in splits:
            labels = self._val_labels(self._find(VAL_SOLUTION), f"no {VAL_SOLUTION}")
        for split in splits:
            split_root = self._root / split if self.layout in ("cls-loc", "imagefolder") else self._root
            if self.layout == "cls-loc" and split == "val":
                yield from self._flat_val(split_root, labels)
            else:
                yield from self._folder_split(split, split_root)

    def _emit(self, split: str, rel_path: str, wnid: str, size: int, mtime: float, **where: Any) -> Candidate:
        self.report.per_split[split] += 1
        self.report.per_class[wnid] += 1
        return Candidate(
            image_id(self.dataset, split, rel_path),
            split,
            rel_path,
            wnid,
            self._label[wnid],
            size,
            mtime,
            **where,
        )

    def _quarantine_no_label(self, split: str, rel_path: str, detail: str) -> None:
        self.report.quarantine.add(
            QuarantineEntry(rel_path, split, Reason.NO_LABEL, detail, image_id(self.dataset, split, rel_path))
        )

    def _walk_files(self, folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
        """Files under FOLDER in sorted order; junk, hidden folders and refused links are counted, not yielded."""
        return self._walker.files(folder)

    def _folder_split(self, split: str, split_root: Path) -> Iterator[Candidate]:
        for path, st in self._walk_files(split_root):
            rel = path.relative_to(self._root).as_posix()
            parts = path.relative_to(split_root).parts
            if len(parts) < 2 or parts[0] not in self._label:
                self._quarantine_no_label(split, rel, "file is not inside a class folder")
                continue
            yield self._emit(split, rel, parts[0], st.st_size, st.st_mtime)

    def _flat_val(self, split_root: Path, labels: dict[str, str]) -> Iterator[Candidate]:
        seen: set[str] = set()  # bounded by the val split (50,000 at ImageNet's count), as the labels are
        for path, st in self._walk_files(split_root):
            rel = path.relative_to(self._root).as_posix()
            seen.add(path.stem)
            wnid = self._val_wnid(labels, rel, path.stem)
            if wnid is not None:
                yield self._emit("val", rel, wnid, st.st_size, st.st_mtime)
        self._record_rows_without_file(labels, seen, str(split_root))

    # ---- tar of tars ------------------------------------------------------------------------------------
    def _tar_candidates(self, tars: ImageNetTars) -> Iterator[Candidate]:
        split = self.flat_split
        # read the labels first: a malformed label file fails the scan before the train tar's 1.28 M headers
        labels: dict[str, str] = {}
        if tars.val is not None:
            labels = self._val_labels(tars.solution, self._solution_hint(tars))
        for entry in self._tar.entries():
            yield self._emit(
                split,
                entry.rel_path,
                entry.wnid,
                entry.size,
                entry.mtime,
                container=self._tar.path.name,
                offset=entry.offset,
            )
        self._record_damage(split, "class tar", self._tar.truncated, self._tar.broken)
        if tars.val is not None:
            yield from self._tar_val(tars.val, labels)

    def _solution_hint(self, tars: ImageNetTars) -> str:
        """What the warning says when the val tar's label file is missing."""
        return no_solution_hint(tars.folder)

    def _archive(self, kind: type[FlatTar], path: PurePath) -> Any:
        """The reader of archive PATH (a local file here; an S3 scan reads it by ranges and caches its index)."""
        return kind(path, self.report.skipped, junk_kind, self._junk)

    def _tar_val(self, path: PurePath, labels: dict[str, str]) -> Iterator[Candidate]:
        """The images of the flat val tar PATH, labelled by LABELS (image id -> wnid); unlabelled ones quarantined."""
        val = self._archive(FlatTar, path)
        seen: set[str] = set()  # bounded by the val split (50,000 at ImageNet's count), as the labels are
        for entry in val.entries():
            stem = PurePosixPath(entry.rel_path).stem
            seen.add(stem)
            wnid = self._val_wnid(labels, entry.rel_path, stem)
            if wnid is not None:
                yield self._emit(
                    "val", entry.rel_path, wnid, entry.size, entry.mtime, container=path.name, offset=entry.offset
                )
        self._record_damage("val", "val tar", val.truncated, val.broken)
        self._record_rows_without_file(labels, seen, path.name)

    def _record_damage(
        self, split: str, what: str, truncated: list[tuple[str, str]], broken: list[dict[str, Any]]
    ) -> None:
        """Quarantine the members cut off by damage; list the unreadable containers with a warning each."""
        for rel, detail in truncated:
            self.report.quarantine.add(
                QuarantineEntry(rel, split, Reason.CORRUPT, detail, image_id(self.dataset, split, rel))
            )
        self.report.broken_containers.extend(broken)
        for entry in broken:
            self.report.warnings.append(
                f"{what} {entry['container']} is unreadable after {entry['members_read']} members "
                f"({entry['error']}); its member count is unknown, the members read before the damage are kept"
            )
