"""Packaging: the top-level dags/, operators/, jobs/ and sql/ folders ship inside the wheel as imgest.dags,
imgest.operators, imgest.jobs and imgest.sql, so a wheel installs no generic top-level names.

imgest.transform._fastjpeg (the JPEG region decode + resample) is compiled against the system's libjpeg-turbo
(Debian: libjpeg-dev). It is optional: without the headers the build skips it and the Pillow path runs instead.
"""

from setuptools import Extension, find_packages, setup

MAPPED = {"imgest.dags": "dags", "imgest.operators": "operators", "imgest.jobs": "jobs", "imgest.sql": "sql"}

FASTJPEG = Extension(
    "imgest.transform._fastjpeg",
    sources=["imgest/transform/_fastjpeg.c"],
    libraries=["jpeg"],
    # No FMA contraction: the AVX2 and baseline clones then round identically, so output bytes do not
    # depend on the CPU.
    extra_compile_args=["-O3", "-ffp-contract=off"],
    optional=True,
)

setup(
    packages=[*find_packages(include=["imgest", "imgest.*"]), *MAPPED],
    package_dir=MAPPED,
    ext_modules=[FASTJPEG],
)
