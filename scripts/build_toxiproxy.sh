#!/usr/bin/env bash
# Builds toxiproxy-server (the TCP latency proxy of `imgest bench read` and the read-back tests) from the Go
# module proxy into <state>/bin/, once. Called by scripts/install.sh --dev.
set -euo pipefail
cd "$(dirname "$0")/.."

module=github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0
state=${IMGEST_HOME:-$PWD/.imgest}
bin="$state/bin/toxiproxy-server"
[ -x "$bin" ] && { echo "imgest install: toxiproxy-server cached at $bin"; exit 0; }
command -v go >/dev/null 2>&1 || {
  echo "imgest install: 'go' not found: install Go (Debian: apt-get install golang) to build $module" >&2; exit 1; }
mkdir -p "$state/bin"
tmp=$(mktemp -d)
GOBIN="$tmp" GOFLAGS=-mod=mod go install "$module"
mv "$tmp/server" "$bin"
rm -rf "$tmp"
echo "imgest install: built toxiproxy-server ($module) at $bin"
