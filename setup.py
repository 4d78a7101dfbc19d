"""Packaging: the top-level dags/, operators/, jobs/ and sql/ folders ship inside the wheel as imgest.dags,
imgest.operators, imgest.jobs and imgest.sql, so a wheel installs no generic top-level names.

imgest.transform._fastjpeg (the JPEG region decode + resample) is compiled from imgest/transform/fastjpeg/*.c
against the system's libjpeg-turbo (Debian: libjpeg-dev). It is optional: without the headers the build skips it
and the Pillow path runs instead.

The Cassandra bulk-load helper's jar (imgest/sinks/cassandra/bulk/helper.jar) is compiled from BulkWriter.java when the
wheel is built (javac, with Maven resolving cassandra-all for it: imgest/sinks/cassandra/bulk_build.py), so that no
task compiles it; `imgest bulk-helper install` then fetches the jars it runs on. Without javac and Maven the wheel
ships no jar and the install says how to build one.

IMGEST_BUILD_TEST_HOOKS=1 in the build's environment also builds imgest.transform._fastjpeg_testing: the same sources
compiled with -DFASTJPEG_TEST_HOOKS, which adds the entry points only the tests call (arithmetic, refine_counts;
imgest/transform/fastjpeg/hooks.c). `make install-dev` sets it for its editable install; a wheel or a plain install
(`make install`) has the production module alone, and the tests that need the hooks then skip (fail under CI).
"""

import os
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

MAPPED = {"imgest.dags": "dags", "imgest.operators": "operators", "imgest.jobs": "jobs", "imgest.sql": "sql"}
FASTJPEG_DIR = Path("imgest/transform/fastjpeg")
FASTJPEG_SOURCES = sorted(p.as_posix() for p in FASTJPEG_DIR.glob("*.c"))
FASTJPEG_HEADERS = sorted(p.as_posix() for p in FASTJPEG_DIR.glob("*.h"))
TEST_HOOKS = os.environ.get("IMGEST_BUILD_TEST_HOOKS") == "1"


def fastjpeg(name: str, macros: list[tuple[str, str | None]]) -> Extension:
    return Extension(
        name,
        sources=FASTJPEG_SOURCES,
        depends=FASTJPEG_HEADERS,  # a changed header rebuilds the module (and ships in the sdist)
        define_macros=macros,
        libraries=["jpeg"],
        # No FMA contraction: the AVX2 and baseline clones then round identically, so output bytes do not
        # depend on the CPU.
        extra_compile_args=["-O3", "-ffp-contract=off"],
        optional=True,
    )


class BuildExt(build_ext):
    """Each extension compiles into a temporary folder of its own: both modules compile the same sources with other
    macros, and would otherwise share (and overwrite) their object files."""

    def build_extension(self, ext: Extension) -> None:
        base = self.build_temp
        self.build_temp = os.path.join(base, ext.name)
        try:
            super().build_extension(ext)
        except Exception as exc:  # optional: say what is missing, then let setuptools skip it
            print(
                f"imgest: {ext.name} not built ({exc}); the transform will run on Pillow alone. For the faster JPEG "
                "decoder install libjpeg-turbo's headers and a C compiler (Debian: apt-get install gcc libjpeg-dev; "
                "RHEL: dnf install gcc libjpeg-turbo-devel) and reinstall imgest.",
                file=sys.stderr,
            )
            raise
        finally:
            self.build_temp = base

    def build_extensions(self) -> None:
        self.parallel = False  # build_temp changes per extension: one at a time
        super().build_extensions()


class BuildPy(build_py):
    """The pure modules and package data, then the bulk-load helper's jar compiled beside its sources."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # a source checkout: `imgest bulk-helper install --build` compiles it
            return
        import importlib.util

        spec = importlib.util.spec_from_file_location("bulk_build", "imgest/sinks/cassandra/bulk_build.py")
        bulk_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bulk_build)
        jar = Path(self.build_lib) / "imgest" / "sinks" / "cassandra" / "bulk" / bulk_build.JAR
        found = bulk_build.tools()
        if found is None:
            print(
                "imgest: no mvn and javac here: the wheel ships no bulk-load helper jar (`imgest bulk-helper install "
                "--build` compiles one where a JDK 17 and Maven are installed)",
                file=sys.stderr,
            )
            return
        import tempfile

        log_file = Path(tempfile.gettempdir()) / "imgest-bulk-helper-build.log"
        try:
            bulk_build.compile_jar(jar, *found, log_file)
        except bulk_build.BuildError as exc:  # optional, as the JPEG module: Maven offline, say; the install says how
            print(f"imgest: the wheel ships no bulk-load helper jar: {exc}", file=sys.stderr)
            return
        print(f"imgest: compiled the bulk-load helper into {jar}", file=sys.stderr)


EXTENSIONS = [fastjpeg("imgest.transform._fastjpeg", [])]
if TEST_HOOKS:
    EXTENSIONS.append(fastjpeg("imgest.transform._fastjpeg_testing", [("FASTJPEG_TEST_HOOKS", "1")]))

setup(
    packages=[*find_packages(include=["imgest", "imgest.*"]), *MAPPED],
    package_dir=MAPPED,
    ext_modules=EXTENSIONS,
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
)
