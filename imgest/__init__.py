"""imgest: turn ImageNet-scale image datasets into training-ready storage."""

__version__ = "0.1.0"
