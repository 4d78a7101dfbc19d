"""Shard target: shard plan, deterministic tar writer, packing, S3/folder stores, verification."""
