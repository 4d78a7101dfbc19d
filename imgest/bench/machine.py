"""The machine record every benchmark report starts with: imgest.core.report's, with the transform's JPEG decoder."""

from __future__ import annotations

from typing import Any

from imgest.core import report
from imgest.transform import fastjpeg


def machine_info() -> dict[str, Any]:
    """Cores, processor, memory, Python, package versions, load, and which JPEG decoder the transform uses."""
    return report.machine_info(**fastjpeg.machine_fields())
