# The README's two commands are `make demo` and `make test`.
.PHONY: demo test test-quick test-browser docs install install-dev install-bench install-peers install-pillow-simd lint lock lock-bulk services-down clean

install:
	bash scripts/install.sh

# The dev install also builds the JPEG region decoder's test module (IMGEST_BUILD_TEST_HOOKS=1: see setup.py), which
# tests/unit/test_fastjpeg.py needs (its tests skip without it, and fail under CI).
install-dev:
	bash scripts/install.sh --dev

# Every benchmark peer pinned to the transitive version, on the dev install's torch (requirements/torch.txt).
install-bench: install-dev
	.venv/bin/uv pip install -q --python .venv/bin/python -r requirements/bench.lock

# pillow-simd, the `imgest bench transform --peers` peer that replaces Pillow: built from its sdist into its own
# environment (.imgest/bench/pillow-simd-venv; about 2 min of CPU on 2 cores, then a no-op).
install-pillow-simd: install-dev
	bash scripts/build_pillow_simd.sh

# The cassandra-dali-plugin peer (fn.crs4.cassandra, crs4.cassandra_utils) built from its PyPI sdist into .venv; the
# build is cached in ~/.cache/imgest/peers by the sha256 of its inputs (first build about 2 min on 2 cores, then about a second).
install-peers: install-dev
	bash scripts/build_crs4_plugin.sh

demo: install
	.venv/bin/imgest demo

# Two workers (pytest-xdist); tests/xdist_groups.py keeps the tests that share a server or a fixture on one.
XDIST = -n 2 --dist loadscope --no-loadscope-reorder

test: install-dev install-peers
	.venv/bin/ruff check .
	.venv/bin/python -m pytest $(XDIST) --durations=30

# The quick tier: every test that needs no server, no Spark job, no browser and no GPU (a few minutes).
test-quick: install-dev
	.venv/bin/ruff check .
	.venv/bin/python -m pytest $(XDIST) --durations=15 -m "not services and not slow and not browser and not gpu"

# The trigger form in Debian's Chromium against airflow standalone; screenshots in .imgest/artifacts/browser/.
test-browser: install-dev
	.venv/bin/python -m pytest -m browser

# The docs site (mkdocs-material, docs/ + mkdocs.yml), strict: any warning fails; open .imgest/site/index.html.
docs: install-dev
	.venv/bin/mkdocs build --strict -d .imgest/site

lint: install-dev
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# Re-pin every transitive dependency after changing pyproject.toml.
lock:
	.venv/bin/uv pip compile pyproject.toml --extra all --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o requirements/runtime.lock
	.venv/bin/uv pip compile pyproject.toml --extra all --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o requirements/dev.lock
	.venv/bin/uv pip compile pyproject.toml --extra all --extra dev --extra bench -c requirements/torch.txt --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o requirements/bench.lock

# Re-lock the bulk-load helper's runtime jars (imgest/sinks/cassandra/bulk/runtime-jars.lock) after changing its pom.
lock-bulk:
	.venv/bin/python -m imgest.sinks.cassandra.bulk_build lock

services-down:
	.venv/bin/imgest services down

clean: services-down
	rm -rf .imgest
