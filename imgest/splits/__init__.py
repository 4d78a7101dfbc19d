"""Train/val split files: arithmetic, safe .npz, crs4 export, and where split rows come from."""

from imgest.splits.split import SplitFile, load_split

__all__ = ["SplitFile", "load_split"]
