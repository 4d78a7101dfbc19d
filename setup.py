"""Packaging: the top-level dags/, operators/, jobs/ and sql/ folders ship inside the wheel as imgest.dags,
imgest.operators, imgest.jobs and imgest.sql, so a wheel installs no generic top-level names."""

from setuptools import find_packages, setup

MAPPED = {"imgest.dags": "dags", "imgest.operators": "operators", "imgest.jobs": "jobs", "imgest.sql": "sql"}

setup(packages=[*find_packages(include=["imgest", "imgest.*"]), *MAPPED], package_dir=MAPPED)
