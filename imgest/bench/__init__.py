"""Benchmarks: each compares imgest with a baseline in the same run and prints figures and JSON."""
