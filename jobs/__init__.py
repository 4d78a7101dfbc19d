"""Spark entry points (run with spark-submit)."""
