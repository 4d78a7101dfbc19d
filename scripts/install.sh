#!/usr/bin/env bash
# Creates .venv and installs imgest from the lock file (reproducible: every package pinned).
#   scripts/install.sh          runtime lock (Airflow, Spark, Cassandra driver, boto3, DALI, SeaweedFS, ...)
#   scripts/install.sh --dev    the same plus the test tools (pytest, hypothesis, ruff, Playwright, toxiproxy-server,
#                               moto's server for the strict AWS)
#                               and the imgest[torch] extra (requirements/torch.txt) for the PyTorch dataset tests
#                               and LitData on that torch (requirements/bench.txt) for the benchmark-peer test
#                               and Debian's chromium for the browser tests (installed with apt-get when run as root)
# Both also build libxnvme into .imgest/xnvme/ when the system has none (scripts/build_xnvme.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

lock=requirements/runtime.lock
[ "${1:-}" = "--dev" ] && lock=requirements/dev.lock

need() { command -v "$1" >/dev/null 2>&1 || { echo "imgest install: '$1' not found on PATH. $2" >&2; exit 1; }; }
need java "Install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless); Cassandra and Spark run on it."
need mvn "Install Apache Maven (Debian: apt-get install maven); it resolves the Cassandra server jars from Maven Central."

# The browser tests drive the distribution's Chromium through Playwright; no browser is downloaded at run time.
if [ "${1:-}" = "--dev" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "imgest install: installing Debian's chromium for the browser tests (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "imgest install: the browser tests need Chromium: sudo apt-get install chromium (skipped without it; under CI they fail)" >&2
  fi
fi

# The compose check (`docker-compose -f docker/compose.yaml config -q`) needs Debian's docker-compose, which
# validates the file without a Docker engine.
if [ "${1:-}" = "--dev" ] && ! command -v docker-compose >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "imgest install: installing Debian's docker-compose for the compose check (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
  else
    echo "imgest install: the compose check needs docker-compose: sudo apt-get install docker-compose (skipped without it; under CI it fails)" >&2
  fi
fi

# The xNVMe check's XFS loop filesystem (`--loop-fs xfs`) is made with mkfs.xfs from Debian's xfsprogs.
if [ "${1:-}" = "--dev" ] && ! command -v mkfs.xfs >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "imgest install: installing Debian's xfsprogs for the xNVMe XFS check (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends xfsprogs >/dev/null
  else
    echo "imgest install: the xNVMe XFS tests need mkfs.xfs: sudo apt-get install xfsprogs (skipped without it)" >&2
  fi
fi

# The deployed Airflow shape (`imgest services up airflow-celery`, the Celery and fault tests) runs Debian's
# PostgreSQL (metadata database) and Redis (Celery broker); `airflow standalone` (the demo) needs neither.
if [ "${1:-}" = "--dev" ] && { ! command -v redis-server >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "imgest install: installing Debian's postgresql and redis-server for the deployed Airflow shape (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql redis-server >/dev/null
  else
    echo "imgest install: the Celery deployment needs PostgreSQL and Redis: sudo apt-get install postgresql redis-server" >&2
  fi
fi

# imgest's JPEG region decoder (imgest/transform/fastjpeg/*.c) is compiled against libjpeg-turbo's headers. It is
# optional: without them the build skips it and the transform runs on Pillow alone (slower, same quarantine).
if ! printf '#include <stdio.h>\n#include <jpeglib.h>\n' | cc -E -x c - >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "imgest install: installing Debian's libjpeg-dev for the JPEG region decoder (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev libjpeg-dev >/dev/null
  else
    echo "imgest install: no libjpeg-turbo headers: the transform will use Pillow alone (sudo apt-get install libjpeg-dev for the faster region decoder)" >&2
  fi
fi

py=""
for cand in "${PYTHON:-}" python3.11 python3.12 python3; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 \
     && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    py=$cand; break
  fi
done
[ -n "$py" ] || { echo "imgest install: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)." >&2; exit 1; }

# An install whose inputs (lock, packaging, C sources, these scripts) are what the last one used is a no-op, so
# `make test-quick` does not pay for it on every run; delete .venv/.imgest-install-* to force one. An install where an
# optional part failed (libxnvme, the class-data archive, the region decoder) writes no stamp, so the next one tries that part again.
mode=runtime
[ "${1:-}" = "--dev" ] && mode=dev
stamp=".venv/.imgest-install-$mode"
inputs=$(cat "$lock" requirements/spark.txt requirements/torch.txt requirements/bench.txt requirements/aws.lock pyproject.toml setup.py imgest/transform/fastjpeg/* scripts/*.sh \
  | sha256sum | cut -c1-16)
if [ -x .venv/bin/imgest ] && [ "$(cat "$stamp" 2>/dev/null)" = "$inputs" ] && .venv/bin/python -c 'import imgest' 2>/dev/null; then
  echo "imgest install: .venv up to date with $lock (inputs $inputs)"
  exit 0
fi

[ -x .venv/bin/python ] || "$py" -m venv .venv
rm -f .venv/.imgest-install-*  # both modes share .venv: an install of either makes the other's stamp stale
.venv/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.8"
# pyspark and pyspark-client are published as sdists only: their wheels are built once into the wheelhouse, where
# this install and the wheel test (tests/packaging) find them. uv otherwise built both at every install (28 s) and
# kept every build in its cache (81 builds of pyspark, 45 GB, on this project's machine).
wheelhouse=${IMGEST_HOME:-$PWD/.imgest}/wheelhouse
mkdir -p "$wheelhouse"
missing=""
for req in $(grep -hE '^(pyspark|pyspark-client)==' "$lock" requirements/spark.txt); do
  name=${req%%==*}; version=${req#*==}
  ls "$wheelhouse/${name//-/_}-$version-"*.whl >/dev/null 2>&1 || missing="$missing $req"
done
if [ -n "$missing" ]; then
  .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheelhouse" $missing \
    || echo "imgest install: could not build$missing into $wheelhouse; uv builds them instead" >&2
fi
# pyspark is never among the environment's packages (imgest.spark.distribution): an environment an older install put
# it in loses it, and pyspark-client, whose files it had overwritten and its uninstall removed, is installed again.
if .venv/bin/uv pip show -q --python .venv/bin/python pyspark >/dev/null 2>&1; then
  .venv/bin/uv pip uninstall -q --python .venv/bin/python pyspark
  .venv/bin/uv pip install -q --python .venv/bin/python --find-links "$wheelhouse" --reinstall-package pyspark-client -r "$lock"
else
  .venv/bin/uv pip install -q --python .venv/bin/python --find-links "$wheelhouse" -r "$lock"
fi
# The dev install also builds the region decoder's test module, imgest.transform._fastjpeg_testing (its test-only
# entry points, FASTJPEG_TEST_HOOKS: see setup.py); the runtime install has the production module alone.
if [ "$mode" = dev ]; then
  IMGEST_BUILD_TEST_HOOKS=1 .venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
else
  rm -f imgest/transform/_fastjpeg_testing.*.so  # a dev install's, of other sources perhaps
  IMGEST_BUILD_TEST_HOOKS=0 .venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
fi
# The imgest[torch] extra (PyTorch datasets over stored data) for its tests: PyPI's CUDA wheel, which runs on CPU.
[ "${1:-}" = "--dev" ] && .venv/bin/uv pip install -q --python .venv/bin/python -r requirements/torch.txt
# LitData (the bench extra) on that torch, for the benchmark-peer test that CI runs (tests/conftest.py).
[ "${1:-}" = "--dev" ] && .venv/bin/uv pip install -q --python .venv/bin/python -r requirements/bench.txt
# Bytecode for every installed module and the project's own: uv installs sources only, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines) every Python process (an Airflow CLI call or task,
# a Spark worker, the imgest CLI) would otherwise compile all it imports again: `airflow version` 5.7 -> 4.1 s.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Left out: packages' own test suites and what no imgest process imports at start (build tools, torch for the
# optional PyTorch datasets, ...): half the sources, 40 s less install; they compile when first imported.
skip="pip|sympy|networkx|torch|torchgen|functorch|triton|fontTools|libcst|setuptools|mesonbuild|hypothesis|dns|mpmath"
skip="$skip|pyathena|sagemaker_studio"
.venv/bin/python -m compileall -q -j 0 -x "/site-packages/($skip)/|/tests?/" "$site" imgest dags operators jobs >/dev/null \
  || echo "imgest install: some modules did not compile to bytecode; they compile when imported" >&2
# Spark itself beside the environment (.venv/share/imgest/spark/pyspark-<version>/, from the wheelhouse): spark-submit,
# local masters and the embedded cluster run it; compiled and compared with Spark's source zip, so that drivers and
# workers import its bytecode (imgest.spark.pypath).
spark_pin=$(grep -E '^pyspark==' requirements/spark.txt)
.venv/bin/imgest spark install --version "${spark_pin#*==}" --find-links "$wheelhouse" >/dev/null \
  || { echo "imgest install: Spark did not install (imgest spark install)" >&2; exit 1; }
# libxnvme for `imgest validate xnvme`: optional, so a failed build only skips the xNVMe engines.
complete=1
bash scripts/build_xnvme.sh || { complete=0; echo "imgest install: continuing without libxnvme; the xNVMe engines will be skipped" >&2; }
# The test tools' own programs: the TCP latency proxy for the read-back checks.
[ "${1:-}" = "--dev" ] && bash scripts/build_toxiproxy.sh
# The strict AWS server of the tests (moto: S3, IAM, STS with IAM authentication on), in its own environment.
[ "${1:-}" = "--dev" ] && bash scripts/build_strict_aws.sh
# Spark's driver classes as a class-data-sharing archive: every job's JVM then starts with a third of the CPU.
.venv/bin/python -m imgest.spark.cds || { complete=0; echo "imgest install: continuing without the Spark class-data archive" >&2; }
# The Cassandra bulk-load helper into .venv/share/imgest/bulk-helper (a task never builds it): this checkout's
# package has no compiled helper.jar, so javac compiles the one class (Maven resolves cassandra-all for it, into the
# local Maven repository), then the locked runtime jars are taken from that repository, checked against their sha256.
# Optional: `auto` writes through CQL without it, saying why.
m2="${IMGEST_M2_REPOSITORY:-$HOME/.m2/repository}"
.venv/bin/imgest bulk-helper install --build --repository "file://$m2" >/dev/null \
  || { complete=0; echo "imgest install: continuing without the Cassandra bulk-load helper (--write-path cql)" >&2; }
decoder=$(.venv/bin/python -c 'from imgest.transform import fastjpeg; print(fastjpeg.default_decoder())')
[ "$decoder" = pillow ] && complete=0  # the region decoder was not built: the next install tries again
[ "$complete" = 1 ] && echo "$inputs" > "$stamp"
echo "imgest install: .venv ready from $lock ($(.venv/bin/python --version), $(.venv/bin/imgest --version), JPEG decoder: $decoder)"
