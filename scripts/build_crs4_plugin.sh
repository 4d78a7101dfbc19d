#!/usr/bin/env bash
# Builds the cassandra-dali-plugin peer (crs4's DALI operator fn.crs4.cassandra and its Python helpers
# crs4.cassandra_utils, release 1.3.2) and installs it into .venv beside imgest (`make install-peers`).
#
# Sources, all without network access except the package registries:
#   - the plugin's sdist from PyPI (pinned by sha256; $IMGEST_CRS4_SDIST names a local copy instead);
#   - libuv 1.52.1 and the DataStax C/C++ driver 2.17.0, which the plugin's CMake would clone from GitHub:
#     ../shared/vendor/ beside the project or $IMGEST_PEER_VENDOR (FetchContent is pointed at them);
#   - CMake and the CUDA headers DALI's headers include, as PyPI wheels installed into the build folder only.
# What is patched, and why (the sdist names DALI 2.1 and a CUDA toolkit; we pin DALI 2.4 and run without one):
#   - CMakeLists.txt: `LANGUAGES CXX C` instead of `CUDA CXX C` (every source is C++), and the CUDA include
#     folder pointed at the headers of the wheels;
#   - cassandra_dali_interactive.h: DALI 2.4's `Operator::Run(Workspace &, bool validate_metadata)` signature.
# The build is cached outside the clone, as uv caches wheels: ${IMGEST_PEERS_CACHE:-~/.cache/imgest/peers}/
# crs4-<version>-<key>, the key a hash of every input (sources' sha256, DALI's version, this script's commands).
# The first build takes about 2 minutes on 2 cores (106 s measured); a cached one installs in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.3.2
sdist_sha=e47b7491f1822a1bc370438c84ad890c594ea953abf7456146350efb4342c9e8
sdist_url=https://files.pythonhosted.org/packages/3f/d6/5368c90929d6fa095c3658bfe2090f477edbb21a7c0ce2766ee95c561d0c/cassandra_dali_plugin-$version.tar.gz
tools=(cmake==3.31.6 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
       nvidia-curand==10.4.0.35)
vendor=${IMGEST_PEER_VENDOR:-../shared/vendor}
cache=${IMGEST_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/imgest/peers}
py=.venv/bin/python
say() { echo "imgest install-peers: $*"; }
fail() { echo "imgest install-peers: $*" >&2; exit 1; }

[ -x "$py" ] || fail "no .venv: run 'make install-dev' first"
libuv="$vendor/libuv-1.52.1.tar.gz"
driver="$vendor/cpp-driver-2.17.0.tar.gz"
for f in "$libuv" "$driver"; do
  [ -f "$f" ] || fail "missing $f: the plugin's CMake needs libuv 1.52.1 and cpp-driver 2.17.0 sources \
(set IMGEST_PEER_VENDOR to a folder holding libuv-1.52.1.tar.gz and cpp-driver-2.17.0.tar.gz, see docs/crs4-plugin.md)"
done
mkdir -p "$cache"
sdist=${IMGEST_CRS4_SDIST:-$cache/cassandra_dali_plugin-$version.tar.gz}
if [ ! -f "$sdist" ]; then
  say "downloading the plugin's sdist from PyPI"
  curl -fsSL --retry 3 -o "$sdist.partial" "$sdist_url" || fail "could not download $sdist_url"
  mv "$sdist.partial" "$sdist"
fi
[ "$(sha256sum "$sdist" | cut -d' ' -f1)" = "$sdist_sha" ] || fail "$sdist does not have sha256 $sdist_sha"

dali=$("$py" -c 'import nvidia.dali as d; print(d.__version__)')
key=$( { echo "$sdist_sha"; sha256sum "$libuv" "$driver" | cut -d' ' -f1; echo "$dali ${tools[*]}"; grep -v '^ *#' "$0"; } \
  | sha256sum | cut -c1-16)
out="$cache/crs4-$version-$key"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

install_into_venv() {
  rm -rf "$site/crs4/cassandra_utils" "$site/libcrs4cassandra.so"
  mkdir -p "$site/crs4"
  cp -r "$out/site/crs4/cassandra_utils" "$site/crs4/"
  cp "$out/site/libcrs4cassandra.so" "$site/"
  # The helpers' and the example scripts' own imports (clize, tqdm, pandas, IPython), pinned.
  .venv/bin/uv pip install -q --python "$py" -r requirements/peers.txt
  echo "$key" > .venv/.imgest-peers
  "$py" -c 'import imgest.peers.crs4 as c; c.load_plugin(); print("imgest install-peers: fn.crs4.cassandra loads", c.plugin_path())'
}

if [ "$(cat .venv/.imgest-peers 2>/dev/null)" = "$key" ] && [ -f "$site/libcrs4cassandra.so" ] \
   && [ -f "$site/crs4/cassandra_utils/__init__.py" ]; then
  say "installed in .venv (key $key, DALI $dali)"
  exit 0
fi
if [ -f "$out/.complete" ]; then
  say "cached build $out (key $key, DALI $dali)"
  install_into_venv
  exit 0
fi

if ! dpkg -s libssl-dev >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "installing libssl-dev (apt-get): the Cassandra driver links OpenSSL"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libssl-dev; } >/dev/null
fi
command -v c++ >/dev/null || fail "no C++ compiler: apt-get install g++"

start=$(date +%s)
work=$(mktemp -d "$cache/build-$key.XXXX")
trap 'rm -rf "$work"' EXIT
say "building $version against DALI $dali in $work (about 2 minutes on 2 cores)"
tar xzf "$sdist" -C "$work"
tar xzf "$libuv" -C "$work"
tar xzf "$driver" -C "$work"
.venv/bin/uv pip install -q --target "$work/tools" "${tools[@]}"
src="$work/cassandra_dali_plugin-$version"
inc="$work/tools/nvidia/cu13/include"  # the CUDA 13 wheels share one include folder (runtime, crt, cccl, curand)
[ -f "$inc/cuda_runtime_api.h" ] || fail "no cuda_runtime_api.h under $inc"
sed -i 's/LANGUAGES CUDA CXX C/LANGUAGES CXX C/' "$src/crs4/cpp/CMakeLists.txt"
sed -i "s|include_directories(SYSTEM \"\${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES}\")|include_directories(SYSTEM $inc)|" \
  "$src/crs4/cpp/CMakeLists.txt"
sed -i 's/void Run(dali::Workspace &ws) override {/void Run(dali::Workspace \&ws, bool validate_metadata = true) override {/' \
  "$src/crs4/cpp/cassandra_dali_interactive.h"
grep -q 'LANGUAGES CXX C' "$src/crs4/cpp/CMakeLists.txt" || fail "the CMakeLists.txt patch did not apply"
grep -q 'validate_metadata' "$src/crs4/cpp/cassandra_dali_interactive.h" || fail "the Run() patch did not apply"

cmake="$work/tools/cmake/data/bin/cmake"
# The plugin's CMake asks `python3` for DALI's flags: the venv's.
PATH="$PWD/.venv/bin:$PATH" "$cmake" -S "$src/crs4/cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DFETCHCONTENT_SOURCE_DIR_LIBUV="$work/libuv-1.52.1" \
  -DFETCHCONTENT_SOURCE_DIR_CASSANDRA_DRIVER="$work/cpp-driver-2.17.0" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$work/lib" > "$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log" >&2; fail "cmake configure failed (log above)"; }
PATH="$PWD/.venv/bin:$PATH" "$cmake" --build "$work/build" --target crs4cassandra -j "$(nproc)" > "$work/build.log" 2>&1 \
  || { grep -m 20 -B2 -A8 'error' "$work/build.log" >&2; fail "the build failed (errors above)"; }

mkdir -p "$work/out/site/crs4"
cp "$work/lib/libcrs4cassandra.so" "$work/out/site/"
cp -r "$src/crs4/cassandra_utils" "$work/out/site/crs4/"
cp "$src/LICENSE" "$work/out/"
echo "cassandra-dali-plugin $version, DALI $dali, built $(date -u +%FT%TZ) in $(( $(date +%s) - start )) s" \
  > "$work/out/BUILD"
rm -rf "$out"
mv "$work/out" "$out"
touch "$out/.complete"
say "built in $(( $(date +%s) - start )) s into $out"
install_into_venv
