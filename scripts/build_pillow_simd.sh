#!/usr/bin/env bash
# Builds pillow-simd (requirements/pillow-simd.txt) from its sdist into its own virtual environment,
# <state>/bench/pillow-simd-venv, for the pillow-simd peer of `imgest bench transform --peers` (it replaces Pillow, so
# it cannot share .venv). Needs a C compiler and the libjpeg and zlib headers (Debian: apt-get install gcc
# libjpeg-dev zlib1g-dev; installed here when run as root). About 2 minutes of CPU on 2 cores; a second run with the
# same pin is a no-op. `make install-pillow-simd` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

state=${IMGEST_HOME:-$PWD/.imgest}
venv="$state/bench/pillow-simd-venv"
pin=$(grep -E '^pillow-simd==' requirements/pillow-simd.txt)
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.imgest-pin" 2>/dev/null)" = "$pin" ]; then
  echo "imgest install: $pin ready in $venv"; exit 0
fi
if ! printf '#include <jpeglib.h>\n#include <zlib.h>\n' | cc -E -x c - >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "imgest install: installing Debian's libjpeg-dev and zlib1g-dev for pillow-simd (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev libjpeg-dev zlib1g-dev >/dev/null
  else
    echo "imgest install: pillow-simd needs the libjpeg and zlib headers: sudo apt-get install libjpeg-dev zlib1g-dev" >&2
    exit 1
  fi
fi
rm -rf "$venv"
"$py" -m venv "$venv"
# pillow-simd's SIMD paths are chosen at compile time: AVX2 where the processor has it, else SSE4.
flags=-msse4
grep -q avx2 /proc/cpuinfo && flags=-mavx2
CC="cc $flags" "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-binary pillow-simd "$pin"
echo "$pin" > "$venv/.imgest-pin"
echo "imgest install: built $pin ($flags) into $venv: $("$venv/bin/python" -c 'import PIL; print(PIL.__version__)')"
