"""Validation of stored bytes through other I/O engines (xNVMe)."""
