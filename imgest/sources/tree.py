"""Walking a folder source safely: symbolic links by an explicit policy, loops detected, every skip counted.

Policy: a link whose target stays inside the source tree is followed; a link that leaves the tree is skipped
(``link-outside-tree``) unless the scan was asked to follow such links (``--follow-external-links``). A link
back into a folder being walked (a loop) and a dangling link are skipped and counted whatever the policy.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Kinds of entries a scan skips on purpose; counted in the scan report under "skipped".
LINK_OUTSIDE = "link-outside-tree"
LINK_LOOP = "link-loop"
LINK_BROKEN = "link-broken"
NOT_REGULAR = "not-a-regular-file"
SAMPLE_LIMIT = 100  # paths kept per kind in the report


@dataclass
class Skips:
    """Entries a scan did not take, counted by kind, with the first paths of each kind as examples."""

    counts: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, path: str, detail: str = "") -> None:
        self.counts[kind] += 1
        kept = self.samples.setdefault(kind, [])
        if len(kept) < SAMPLE_LIMIT:
            kept.append(f"{path}: {detail}" if detail else path)

    def to_dict(self) -> dict[str, object]:
        return {"counts": dict(sorted(self.counts.items())), "samples": dict(sorted(self.samples.items()))}


def inside(root: Path, path: Path) -> bool:
    """True if PATH, with every link resolved, lies inside ROOT (itself resolved)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


@dataclass
class TreeWalker:
    """Yields (path, stat) of the files under a folder in sorted order, applying the link policy."""

    root: Path
    skips: Skips
    follow_external: bool = False
    junk: Callable[[str], str | None] = lambda name: None
    on_junk: Callable[[str], None] = lambda kind: None

    def files(self, folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
        """Every file under FOLDER (a folder inside ROOT), hidden folders and junk reported, not yielded."""
        st = os.stat(folder)
        yield from self._walk(folder, {(st.st_dev, st.st_ino)})

    def _walk(self, folder: Path, ancestors: set[tuple[int, int]]) -> Iterator[tuple[Path, os.stat_result]]:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = Path(entry.path)
            st = self._target_stat(entry, path)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.name.startswith("."):
                    self.on_junk("hidden-folder")
                    continue
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    self.skips.add(LINK_LOOP, self._rel(path), "links back to a folder that contains it")
                    continue
                yield from self._walk(path, ancestors | {key})
                continue
            if not stat.S_ISREG(st.st_mode):
                self.skips.add(NOT_REGULAR, self._rel(path), "not a regular file (device, FIFO or socket)")
                continue
            kind = self.junk(entry.name)
            if kind:
                self.on_junk(kind)
                continue
            yield path, st

    def _target_stat(self, entry: os.DirEntry[str], path: Path) -> os.stat_result | None:
        """The stat of ENTRY's target, or None (and a recorded skip) when the link policy refuses it."""
        if not entry.is_symlink():
            return entry.stat(follow_symlinks=False)
        try:
            st = os.stat(path)
        except OSError as exc:
            kind = LINK_LOOP if exc.errno == errno.ELOOP else LINK_BROKEN
            self.skips.add(kind, self._rel(path), exc.strerror or type(exc).__name__)
            return None
        if not self.follow_external and not inside(self.root, path):
            self.skips.add(LINK_OUTSIDE, self._rel(path), "target is outside the source (--follow-external-links)")
            return None
        return st

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()
