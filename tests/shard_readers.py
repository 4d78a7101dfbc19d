"""Reading shards back the two ways users do: webdataset.WebDataset and DALI fn.readers.webdataset (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_webdataset(tars: list[Path]) -> dict[str, dict[str, bytes]]:
    """key -> {ext: bytes} for every sample, through webdataset's own reader."""
    import webdataset as wds

    samples: dict[str, dict[str, bytes]] = {}
    for sample in wds.WebDataset([str(t) for t in tars], shardshuffle=False, empty_check=False):
        key = sample["__key__"]
        assert key not in samples, f"duplicate key {key}"
        samples[key] = {k: v for k, v in sample.items() if not k.startswith("__")}
    return samples


def read_dali(tars: list[Path], exts: tuple[str, ...], indexes: list[Path] | None = None) -> list[tuple[bytes, ...]]:
    """Every sample's members EXTS, in order, through DALI's webdataset reader with our .idx files (INDEXES: the
    manifest's, where a refresh indexed only a kept tar's live samples; by default the one beside each tar)."""
    from nvidia.dali import fn, pipeline_def

    idx = [str(i) for i in indexes] if indexes else [str(t.with_suffix(".idx")) for t in tars]

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        return tuple(
            fn.readers.webdataset(
                paths=[str(t) for t in tars],
                index_paths=idx,
                ext=list(exts),
                missing_component_behavior="error",
                random_shuffle=False,
                name="r",
            )
        )

    p = pipe()
    p.build()
    total = p.epoch_size("r")
    out = []
    for _ in range(total):
        batch = p.run()
        out.append(tuple(bytes(np.array(batch[i][0])) for i in range(len(exts))))
    return out
