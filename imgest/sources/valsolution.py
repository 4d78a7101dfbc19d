"""ImageNet's val labels, ``LOC_val_solution.csv`` (Kaggle's layout): image id -> wnid, checked line by line.

Each row is ``ImageId,PredictionString``; the PredictionString lists boxes as ``<wnid> x0 y0 x1 y1`` and the
image's class is the first wnid (``ILSVRC2012_val_00008726,n02119789 255 142 454 329 n02119789 44 21 322 295``).
A file that does not have that shape is refused with its path and line: a half-read label file would label
only part of the split, without a trace.

The ILSVRC devkit's ``ILSVRC2012_validation_ground_truth.txt`` is not read: it holds ILSVRC2012_IDs, whose
mapping to wnids lives in the devkit's MATLAB ``meta.mat`` and is not the sorted-wnid order imgest's labels use.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import NoReturn

from imgest.core.errors import ConfigError

VAL_SOLUTION = "LOC_val_solution.csv"
DEVKIT_GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
COLUMNS = ("ImageId", "PredictionString")


class ValSolutionError(ConfigError):
    """LOC_val_solution.csv is malformed: the message names the file, the line and what to fix."""


def read_val_solution(path: Path) -> dict[str, str]:
    """Image id (file stem) -> wnid (the first of its PredictionString) for every row of PATH.

    Raises ValSolutionError naming PATH and the line when the header is not ``ImageId,PredictionString``, a row
    has another number of fields, an empty ImageId or PredictionString, or an ImageId repeats.
    """
    labels: dict[str, str] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None or tuple(h.strip().lstrip("\ufeff") for h in header) != COLUMNS:
                _fail(path, 1, f"the header is {header!r}; expected {','.join(COLUMNS)}")
            for row in reader:
                if row:  # blank lines are skipped
                    _add_row(path, reader.line_num, row, labels)
        except csv.Error as exc:
            _fail(path, reader.line_num, f"not CSV ({exc})")
        except UnicodeDecodeError as exc:
            _fail(path, reader.line_num + 1, f"not UTF-8 text ({exc.reason} at about this line)")
    return labels


def _add_row(path: Path, line: int, row: list[str], labels: dict[str, str]) -> None:
    if len(row) != len(COLUMNS):
        _fail(path, line, f"{len(row)} fields; expected 2 ({','.join(COLUMNS)})")
    image, prediction = row[0].strip(), row[1].split()
    if not image or not prediction:
        _fail(path, line, "an empty ImageId or PredictionString")
    if image in labels:
        _fail(path, line, f"ImageId {image!r} appears a second time")
    labels[image] = prediction[0]


def _fail(path: Path, line: int, problem: str) -> NoReturn:
    raise ValSolutionError(
        f"{path} line {line}: {problem}. Each row must be ImageId,PredictionString with the image's wnid first "
        f"(e.g. ILSVRC2012_val_00008726,n02119789 255 142 454 329); fix or replace the file and scan again"
    )
