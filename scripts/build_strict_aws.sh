#!/usr/bin/env bash
# Builds the strict AWS test server's environment (moto's server: S3, IAM and STS with IAM authentication on;
# imgest.services.strict_aws) into <state>/aws/venv from requirements/aws.lock (every package pinned), apart from
# .venv: moto's Flask stack stays out of Airflow's environment. A second run with the same lock is a no-op.
# Called by scripts/install.sh --dev.
set -euo pipefail
cd "$(dirname "$0")/.."

state=${IMGEST_HOME:-$PWD/.imgest}
venv="$state/aws/venv"
want=$(sha256sum requirements/aws.lock | cut -c1-16)
if [ -x "$venv/bin/moto_server" ] && [ "$(cat "$venv/.imgest-lock" 2>/dev/null)" = "$want" ]; then
  echo "imgest install: the strict AWS server (moto) ready in $venv"; exit 0
fi
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
rm -rf "$venv"
mkdir -p "$state/aws"
"$py" -m venv "$venv"
uv=.venv/bin/uv
[ -x "$uv" ] || uv=uv
"$uv" pip install -q --python "$venv/bin/python" -r requirements/aws.lock
echo "$want" > "$venv/.imgest-lock"
echo "imgest install: the strict AWS server ($(grep -E '^moto' requirements/aws.lock)) built into $venv"
