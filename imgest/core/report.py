"""The benchmarks' reports, shared by every benchmark: the machine record, an aligned table on stdout, a JSON file,
and the plots (matplotlib without a display: :func:`pyplot`, :func:`save_figure`, a grouped :func:`bar_chart`).

matplotlib is an optional extra (``imgest[plots]``, also in ``imgest[bench]``): the runtime's steps draw their
plots through :func:`optional_plot`, which draws none (and says why, once) where matplotlib is missing."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
PLOTS_EXTRA = "pip install 'imgest[plots]'"

# The packages whose versions decide the figures (those installed are reported).
VERSIONED = (
    "pillow",
    "numpy",
    "pyspark",
    "pyspark-client",
    "webdataset",
    "litdata",
    "torch",
    "cassandra-driver",
    "boto3",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(**extra: Any) -> dict[str, Any]:
    """What the figures were measured on: cores, processor, memory, Python, the packages that matter, and EXTRA
    (the transform's JPEG decoder: ``imgest.transform.fastjpeg.machine_fields()``; core imports no transform)."""
    from importlib import metadata

    import PIL

    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {
        "python": platform.python_version(),
        "pillow": PIL.__version__,
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "processor": _cpu_model(),
        "memory_gib": round(pages * os.sysconf("SC_PAGE_SIZE") / 2**30, 1) if pages else None,
        "versions": versions,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **extra,
    }


def describe_machine(info: dict[str, Any]) -> str:
    """One line a person reads before the figures: cores, processor, memory, versions, decoder."""
    versions = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
    decoder = info.get("jpeg_decoder", "?")
    if info.get("libjpeg_turbo"):
        decoder += f" (libjpeg-turbo {info['libjpeg_turbo']})"
    return (
        f"machine: {info.get('usable_cores')} cores of {info.get('processor')}, {info.get('memory_gib')} GiB, "
        f"Python {info.get('python')}, load {info.get('load_average')}; {versions}; JPEG decoder {decoder}"
    )


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """Rows as an aligned text table; COLUMNS are (key, header)."""
    cells = [[h for _, h in columns]] + [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def plots_missing() -> str | None:
    """Why no plot can be drawn here (matplotlib not installed, or its import fails), or None when one can."""
    try:
        if importlib.util.find_spec("matplotlib") is None:
            return f"matplotlib is not installed ({PLOTS_EXTRA})"
        import matplotlib  # noqa: F401
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "matplotlib":
            return f"matplotlib is not installed ({PLOTS_EXTRA})"
        return f"matplotlib cannot be imported ({type(exc).__name__}: {exc}; reinstall it: {PLOTS_EXTRA})"
    return None


def optional_plot(path: Path, draw: Callable[[Path], None]) -> Path | None:
    """DRAW the plot at PATH and return PATH; where matplotlib is missing, log once why, remove a PNG an earlier
    run left at PATH (it would not show this report) and return None."""
    reason = plots_missing()
    if reason is None:
        draw(path)
        return path
    log.warning("no plot: %s", reason)
    path.unlink(missing_ok=True)
    return None


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed); ModuleNotFoundError naming the extra without it."""
    reason = plots_missing()
    if reason is not None:
        raise ModuleNotFoundError(f"plotting needs matplotlib: {reason}", name="matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """FIG laid out tight, saved as PNG at PATH (110 dpi, its folder made), and closed."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def bar_chart(
    path: Path, title: str, groups: list[str], series: dict[str, list[float]], ylabel: str, log: bool = False
) -> None:
    """Grouped bar chart saved as PNG (matplotlib, no display needed)."""
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + i * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    save_figure(fig, path)
