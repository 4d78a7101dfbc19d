#!/usr/bin/env bash
# Builds libxnvme into the state folder when no system libxnvme is found (called by scripts/install.sh).
#
# Source, first found: $IMGEST_XNVME_SRC (a tarball), ../shared/vendor/xnvme-<version>.tar.gz beside the project,
# upstream's release tarball (only where the network allows). meson and ninja come from the venv (PyPI);
# liburing-dev, libaio-dev and pkg-config from Debian (installed when root, otherwise the command is printed).
# The build lands in <state>/xnvme/install and is cached: the same tarball (by sha256) is not rebuilt.
# Exits non-zero with the reason on stderr when it cannot build; install.sh carries on without it.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.7.5
state=${IMGEST_HOME:-$PWD/.imgest}
prefix="$state/xnvme/install"
stamp="$prefix/.source-sha256"
say() { echo "imgest install: libxnvme: $*"; }
fail() { echo "imgest install: libxnvme not built: $*" >&2; exit 1; }

find_lib() { find "$prefix" -name 'libxnvme.so' -print -quit 2>/dev/null || true; }

if [ -z "${IMGEST_XNVME_SRC:-}" ]; then
  if pkg-config --exists xnvme 2>/dev/null || ldconfig -p 2>/dev/null | grep -q 'libxnvme\.so'; then
    say "using the system's libxnvme (set IMGEST_XNVME_SRC to build one anyway)"
    exit 0
  fi
fi

src=${IMGEST_XNVME_SRC:-}
if [ -z "$src" ] && [ -f "../shared/vendor/xnvme-$version.tar.gz" ]; then
  src="$(cd ../shared/vendor && pwd)/xnvme-$version.tar.gz"
fi
if [ -z "$src" ]; then
  src="$state/xnvme/xnvme-$version.tar.gz"
  if [ ! -f "$src" ]; then
    url="https://github.com/xnvme/xnvme/releases/download/v$version/xnvme-$version.tar.gz"
    mkdir -p "$state/xnvme"
    curl -fsSL --max-time 60 -o "$src.partial" "$url" 2>/dev/null \
      || { rm -f "$src.partial"; fail "no source: set IMGEST_XNVME_SRC to an xnvme-$version.tar.gz, put it in \
../shared/vendor/, or install libxnvme from your distribution (the download of $url failed)"; }
    mv "$src.partial" "$src"
  fi
fi
[ -f "$src" ] || fail "IMGEST_XNVME_SRC=$src is not a file"
sha=$(sha256sum "$src" | cut -d' ' -f1)

lib=$(find_lib)
if [ -n "$lib" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sha" ]; then
  say "cached build $lib (source sha256 ${sha:0:12})"
  exit 0
fi

debs=(liburing-dev libaio-dev pkg-config)
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} (apt-get)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } >/dev/null \
      || say "apt-get failed; building without ${missing[*]}"
  else
    say "missing ${missing[*]}: run 'sudo apt-get install -y ${missing[*]}' for the io_uring and libaio backends"
  fi
fi

[ -x .venv/bin/meson ] && [ -x .venv/bin/ninja ] || fail "meson/ninja are not in .venv (reinstall from the lock file)"
export PATH="$PWD/.venv/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "building from $src (seconds to a minute)"
tar xzf "$src" -C "$work"
srcdir=$(find "$work" -mindepth 1 -maxdepth 1 -type d -print -quit)
rm -rf "$prefix"
( cd "$srcdir" \
  && meson setup build -Dwith-spdk=disabled -Dwith-libvfn=disabled -Dwith-isal=disabled \
       -Dexamples=false -Dtests=false -Dprefix="$prefix" \
  && ninja -C build install ) >"$work/build.log" 2>&1 \
  || { tail -20 "$work/build.log" >&2; fail "meson/ninja failed (log above)"; }
lib=$(find_lib)
[ -n "$lib" ] || fail "the build installed no libxnvme.so under $prefix"
echo "$sha" >"$stamp"
say "built $lib"
