"""Files target: the transformed images as <split>/<wnid>/<id>.<ext>, the tree DALI fn.readers.file reads."""
