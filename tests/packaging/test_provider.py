"""imgest installed as a user installs it (issue #52): into a fresh environment that already holds the platform's
Airflow, as a provider package, without changing that Airflow or its providers.

Two platforms, each in its own virtual environment:
- Airflow 3.1 (the oldest line supported) with the providers and libraries imgest needs at the lowest versions its
  ranges allow (uv's lowest-direct resolution), and imgest without extras: no DALI, no matplotlib;
- Airflow 3.3 at the pins of requirements/runtime.lock, and imgest[dali,plots].
In each: Airflow's and the providers' versions are what the platform had, `airflow providers list` shows imgest, the
wheel's compiled JPEG module loads, `imgest dags install` writes DAG files that import without an error or a
deprecation warning from imgest, and `airflow dags test ingest_imagenet` on the generated sample writes shards to the
embedded S3 server and reads them back.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from imgest.core.paths import repo_root, state_dir
from imgest.services import CassandraServer, S3Server
from imgest.sinks.shards.store_names import manifest_objects
from imgest.splits.split import load_split
from tests.packaging.conftest import _run, interpreter, path_without_build_tools

pytestmark = [pytest.mark.slow, pytest.mark.services]
ROOT = repo_root()
UV = Path(sys.executable).parent / "uv"
LEGS = {
    "3.1": {"airflow": "apache-airflow==3.1.*", "resolution": "lowest-direct", "extras": "", "python": "3.11"},
    "3.3": {"airflow": "apache-airflow==3.3.*", "resolution": "lock", "extras": "[dali,plots]", "python": "3.11"},
    # Airflow 3's images run Python 3.12: the manylinux wheel (libjpeg-turbo inside, helper.jar compiled at build)
    "3.3-py3.12": {
        "airflow": "apache-airflow==3.3.*",
        "resolution": "lock",
        "extras": "[dali,plots]",
        "python": "3.12",
    },
}
# The generated sample (DEMO_SAMPLE): 10 classes of 20 train images, and in class 0 the 8 planted images that are
# kept (5 more are quarantined, 3 junk files skipped); 8:2 per class: 28 -> [22, 6], 20 -> [16, 4].
DEMO_TRAIN = 10 * 20 + 8
DEMO_SPLIT = [22 + 9 * 16, 6 + 9 * 4]
DEMO_STORED = DEMO_TRAIN + 10 * 5  # and its 5 val images a class
# Airflow 3.2 is in the range but not a leg: 3.2.2 installed without Airflow's constraints file fails its own
# execution API (pydantic: TITerminalStatePayload needs a discriminator) on any DAG, imgest's or a one-task one.


def _freeze(py: Path) -> dict[str, str]:
    """Name -> version of every distribution in PY's environment."""
    listed = json.loads(_run(UV, "pip", "list", "--format", "json", "--python", py).stdout)
    return {d["name"].lower(): d["version"] for d in listed}


def _runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without extras (the runtime ranges), as requirement strings."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [
        line.split(": ", 1)[1]
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


class Platform:
    """A fresh environment holding a platform's Airflow, then imgest's wheel."""

    def __init__(self, leg: str, home: Path) -> None:
        self.leg, self.home = leg, home
        self.line = LEGS[leg]["airflow"].split("==")[1].removesuffix(".*")  # Airflow's line: 3.1, 3.3
        self.venv = home / "venv"
        self.py = self.venv / "bin" / "python"
        self.dali = "dali" in LEGS[leg]["extras"]
        self.before: dict[str, str] = {}
        self.after: dict[str, str] = {}

    def install(self, wheel: Path) -> None:
        spec = LEGS[self.leg]
        wheelhouse = state_dir() / "wheelhouse"  # pyspark's wheel, built by scripts/install.sh from its sdist
        links = ["--find-links", wheelhouse] if wheelhouse.is_dir() else []
        pip = [UV, "pip", "install", "-q", "--python", self.py, *links]
        _run(UV, "venv", "-q", "--python", interpreter(spec["python"]), self.venv)
        # The platform: its Airflow, then (on 3.1) the oldest providers and libraries imgest's ranges allow.
        if spec["resolution"] == "lock":
            _run(*pip, "-c", ROOT / "requirements" / "runtime.lock", spec["airflow"])
        else:
            _run(*pip, spec["airflow"])
            airflow = f"apache-airflow=={_freeze(self.py)['apache-airflow']}"
            ranges = [r for r in _runtime_requirements(wheel) if not r.startswith("apache-airflow ")]
            _run(*pip, "--resolution", "lowest-direct", airflow, *ranges)
        self.before = _freeze(self.py)
        # imgest as a user adds it: the wheel (with the leg's extras), resolved against what is there.
        constraints = ["-c", ROOT / "requirements" / "runtime.lock"] if spec["resolution"] == "lock" else []
        _run(*pip, *constraints, f"imgest{spec['extras']} @ {wheel.as_uri()}")
        self.after = _freeze(self.py)
        # Spark beside the environment, as an image's build runs it (pyspark is published as an sdist only: the
        # wheel scripts/install.sh built into the wheelhouse); uv on PATH, as the environment holds no pip
        env = {**os.environ, "PATH": f"{UV.parent}:{os.environ.get('PATH', '')}"}
        _run(self.venv / "bin" / "imgest", "spark", "install", *map(str, links), env=env)

    def env(self, s3: S3Server) -> dict[str, str]:
        key, secret = s3.credentials()
        connections = {
            "cassandra_default": {"conn_type": "cassandra", "host": "127.0.0.1", "port": 9042},
            "aws_default": {
                "conn_type": "aws",
                "login": key,
                "password": secret,
                "extra": {"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
            },
            "spark_default": {
                "conn_type": "spark",
                "host": "local[2]",
                "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
            },
        }
        # as on a worker image: Java's runtime on PATH, no JDK, Maven or C compiler (JAVA_HOME's bin/ holds javac)
        bare = path_without_build_tools(self.home / "bare-bin")
        return {
            "PATH": f"{self.venv / 'bin'}:{bare}",
            "HOME": str(self.home),
            "AIRFLOW_HOME": str(self.home / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "IMGEST_HOME": str(self.home / "imgest"),
            **{f"AIRFLOW_CONN_{k.upper()}": json.dumps(v) for k, v in connections.items()},
        }


@pytest.fixture(scope="module", params=sorted(LEGS))
def platform(request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Platform:
    if ROOT is None:
        pytest.skip("needs a source checkout")
    python = LEGS[request.param]["python"]
    if python != "3.11":  # another CPython: its manylinux wheel
        wheel = request.getfixturevalue("manylinux_wheels")[python]
    made = Platform(request.param, tmp_path_factory.mktemp(f"airflow-{request.param}"))
    made.install(wheel)
    return made


def test_the_platform_keeps_its_airflow_and_providers(platform: Platform) -> None:
    before, after = platform.before, platform.after
    assert before["apache-airflow"].startswith(platform.line + ".")
    changed = {name: (before[name], after.get(name)) for name in before if after.get(name) != before[name]}
    assert changed == {}  # nothing the platform had was replaced or removed
    added = set(after) - set(before)
    if platform.leg == "3.1":  # the platform has the providers, at the lowest the ranges allow (so they are tested)
        assert added == {"imgest"}
        assert before["apache-airflow-providers-apache-spark"] == "5.3.1"
        assert before["apache-airflow-providers-apache-cassandra"] == "3.8.0"
        assert before["apache-airflow-providers-amazon"] == "9.14.0"
        assert "nvidia-dali-cuda130" not in after
        assert "matplotlib" not in after
    else:  # Airflow alone: the wheel brings the providers and its extras, beside it
        assert {"imgest", "apache-airflow-providers-amazon", "matplotlib"} <= added
        assert ("nvidia-dali-cuda130" in added) == platform.dali


def test_pyspark_files_have_one_owner_and_spark_stands_apart(platform: Platform, s3_server: S3Server) -> None:
    """imgest requires no pyspark: PySpark's files in the environment belong to one distribution, the Spark
    provider's (pyspark-client from 5.4 on; pyspark itself on the 3.1 leg, whose provider 5.3.1 requires it), each as
    its RECORD lists it (nothing wrote over them); the Spark jobs run is `imgest spark install`'s, outside every
    import path."""
    probe = (
        "import base64, hashlib, json, importlib.metadata as md\n"
        "owners, bad = {}, []\n"
        "for d in md.distributions():\n"
        "    for f in d.files or ():\n"
        "        if str(f).startswith('pyspark/'):\n"
        "            owners.setdefault(str(f), []).append(d.metadata['Name'])\n"
        "            if f.hash and base64.urlsafe_b64encode(hashlib.sha256(f.locate().read_bytes()).digest())"
        ".rstrip(b'=').decode() != f.hash.value:\n"
        "                bad.append(str(f))\n"
        "shared = {f: o for f, o in owners.items() if len(o) > 1}\n"
        "print(json.dumps({'dists': sorted({n for o in owners.values() for n in o}), 'files': len(owners), "
        "'shared': shared, 'bad': bad}))"
    )
    env = platform.env(s3_server)
    got = json.loads(_run(platform.py, "-c", probe, env=env, cwd=platform.home).stdout.strip().splitlines()[-1])
    assert got["dists"] == (["pyspark"] if platform.leg == "3.1" else ["pyspark-client"])
    assert got["files"] > 300
    assert (got["shared"], got["bad"]) == ({}, [])
    status = _run(platform.venv / "bin" / "imgest", "spark", "status", env=env, cwd=platform.home).stdout
    assert f"Spark in {platform.venv}/share/imgest/spark/pyspark-" in status
    assert "(imgest spark install (pyspark " in status


def test_airflow_lists_imgest_and_the_wheel_module_loads(platform: Platform, s3_server: S3Server) -> None:
    env = platform.env(s3_server)
    listed = _run(platform.venv / "bin" / "airflow", "providers", "get", "imgest", "--output", "json", env=env)
    record = json.loads(listed.stdout[listed.stdout.index("[") :])
    assert record[0]["Provider"] == "imgest"
    assert record[0]["Version"] == platform.after["imgest"]
    probe = "from imgest.transform import fastjpeg; import json; print(json.dumps(fastjpeg.machine_fields()))"
    fields = json.loads(_run(platform.py, "-c", probe, env=env, cwd=platform.home).stdout.strip().splitlines()[-1])
    assert fields["jpeg_decoder"] != "pillow"  # the compiled module from the wheel loaded
    assert fields["libjpeg_turbo"]
    if LEGS[platform.leg]["python"] != "3.11":  # the manylinux wheel: the libjpeg-turbo it carries, not the system's
        maps = (
            "import imgest.transform._fastjpeg; print(*{l.split()[-1] for l in open('/proc/self/maps') if 'jpeg' in l})"
        )
        libs = _run(platform.py, "-c", maps, env=env, cwd=platform.home).stdout.split()
        assert libs, "no libjpeg mapped"
        assert all("/site-packages/imgest.libs/libjpeg" in lib for lib in libs if "libjpeg" in lib), libs


def test_dag_files_import_without_errors_or_deprecations(platform: Platform, s3_server: S3Server) -> None:
    env = platform.env(s3_server)
    out = _run(platform.venv / "bin" / "imgest", "dags", "install", platform.home / "dags", env=env).stdout
    assert "cassandra_default" in out  # what the deployment sets is printed
    report = platform.home / "dagbag.json"
    script = Path(__file__).parents[1] / "dags" / "dagbag_report.py"
    _run(platform.py, script, platform.home / "dags", report, env=env, cwd=platform.home)
    bag = json.loads(report.read_text())
    assert bag["import_errors"] == {}
    assert set(bag["dags"]) == {"ingest_imagenet", "check_datasets", "smoke_services"}  # no datasets file: no refresh
    assert bag["dags"]["ingest_imagenet"]["fileloc"] == str(platform.home / "dags" / "imgest_ingest_imagenet.py")
    from tests.dags.dagbag_report import deprecations

    package = [str(p) for p in platform.venv.glob("lib/python3.*/site-packages/imgest")]
    assert package
    assert deprecations(bag, [str(platform.home / "dags"), *package]) == []  # removals and parse-time ones included


def test_wheel_runs_cli_and_loads_schema_and_dags(platform: Platform, tmp_path: Path) -> None:
    venv, py = platform.venv, platform.py
    assert "ingest" in _run(venv / "bin" / "imgest", "--help", cwd=tmp_path).stdout
    probe = (
        "import json; from imgest.core.paths import dags_dir, jobs_dir, repo_root; "
        "from imgest.sinks.cassandra.schema import TableLayout, schema_statements; "
        "print(json.dumps({'root': repo_root() is None, 'dags': str(dags_dir()), 'jobs': str(jobs_dir()), "
        "'cql': len(schema_statements(TableLayout(), ['train'], 'SimpleStrategy:1'))}))"
    )
    got = json.loads(_run(py, "-c", probe, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert got["root"] is True  # not running from the checkout
    assert str(venv) in got["dags"]
    assert str(venv) in got["jobs"]
    assert got["cql"] >= 4
    report = tmp_path / "dagbag.json"
    env = {"AIRFLOW_HOME": str(tmp_path / "af"), "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    script = Path(__file__).parents[1] / "dags" / "dagbag_report.py"
    _run(py, script, got["dags"], report, cwd=tmp_path, env=env)
    bag = json.loads(report.read_text())
    assert bag["import_errors"] == {}
    assert {"ingest_imagenet", "smoke_services"} <= set(bag["dags"])


def test_wheel_ships_itself_to_spark_executors(platform: Platform, tmp_path: Path) -> None:
    venv = platform.venv
    probe = (
        "import zipfile; from imgest.spark.submit import package_zip, submit_command; "
        "cmd = submit_command('ingest_cassandra', ['--manifest-dir', 'x'], 'spark://127.0.0.1:7077'); "
        "z = cmd[cmd.index('--py-files') + 1]; names = zipfile.ZipFile(z).namelist(); "
        "print(len(names) == len(set(names)), 'imgest/sql/data_table.cql' in names, "
        "'imgest/sinks/cassandra/client.py' in names, cmd[-3].endswith('imgest/jobs/ingest_cassandra.py'))"
    )
    env = {"IMGEST_HOME": str(tmp_path / "state"), "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = _run(venv / "bin" / "python", "-c", probe, cwd=tmp_path, env=env).stdout.split()
    assert out[-4:] == ["True", "True", "True", "True"]


def test_the_sample_dag_runs_against_the_stores(
    platform: Platform, cassandra_server: CassandraServer, s3_server: S3Server
) -> None:
    """The generated sample into shards of at most 10 samples on S3: every task ran (the other targets skipped), the
    manifest names objects that are there, gc kept the published version, the split holds every train sample and
    the read-back compared every one of them (with DALI's readers on 3.3; without DALI, its own readers and the
    reason on 3.1)."""
    env = platform.env(s3_server)
    dataset = f"provider-{platform.leg.replace('.', '')}-{platform.home.name}"
    prefix = f"tests/{dataset}"
    # check_seconds 0: every reader (DALI's s3:// last) reads the whole train split whatever the machine's load; the
    # budget's cuts are tests/readback/test_read_budget_step.py's
    conf = {
        "sample": True,
        "target": "shards",
        "dataset": dataset,
        "s3_dest": f"s3://imgest/{prefix}",
        "check_seconds": 0,
    }
    airflow = platform.venv / "bin" / "airflow"
    _run(platform.venv / "bin" / "imgest", "dags", "install", "--force", platform.home / "dags", env=env)
    _run(airflow, "db", "migrate", env=env, cwd=platform.home)
    proc = _run_unchecked(
        airflow, "dags", "test", "ingest_imagenet", "--conf", json.dumps({**conf, "shard_max_count": 10}), env=env
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    db = platform.home / "airflow" / "airflow.db"
    states = _states(db)
    for task in ("validate", "scan", "prepare_bucket", "ingest_shards", "verify_shards", "build_split"):
        assert states[task] == "success", (task, states)
    for task in ("read_throughput", "publish_asset", "gc", "release_lock"):
        assert states[task] == "success", (task, states)
    assert states["ingest_cassandra"] == states["ingest_files"] == "skipped"

    client = s3_server.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key=f"{prefix}/manifest.json")["Body"].read())
    train = doc["samples"]["train"]
    assert train == DEMO_TRAIN
    assert all(s["samples"] <= 10 for s in doc["shards"])
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="imgest", Prefix=f"{prefix}/")
    listed = {o["Key"].removeprefix(f"{prefix}/") for page in pages for o in page.get("Contents", [])}
    assert manifest_objects(doc) <= listed
    gc = _xcom(db, "gc")
    assert (gc["current"], gc["kept"][0], gc["keep_versions"]) == (doc["key"], doc["key"], 1)
    work = platform.home / "imgest" / "work" / dataset
    split = load_split(work / "split-shards.npz")
    assert [len(p) for p in split.parts] == DEMO_SPLIT  # every train sample in a part, cut 8:2 per class
    assert split.source["location"] == conf["s3_dest"]

    read = _xcom(db, "read_throughput")
    assert read["full_read"] is True
    assert read["checked"] == train  # every train sample read back and compared
    report = json.loads((work / "read_throughput.json").read_text())
    for r in report["readers"]:  # no budget: every reader read every train sample, each one compared
        assert r["ok"], r
        assert r["images"] == train, r
        assert not r["budget_cut"], r
    assert doc["checks"]["read_throughput"].endswith("read_throughput.json")  # referenced from manifest.json
    why = "DALI is not installed (pip install 'imgest[dali]')"
    if not platform.dali:  # imgest's own readers checked the bytes, the DALI readers say why not
        assert set(read["readers"]) == {"shards-s3-stream/raw", "shards-s3-webdataset/raw"}
        assert sorted(read["skipped"]) == [
            f"shards-s3-dali (raw): {why}",
            f"shards-s3-dali (train): {why}",
            f"shards-s3-stream (train): {why}",
            f"shards-s3-webdataset (train): {why}",
        ]
    else:
        assert {"shards-s3-dali/raw", "shards-s3-stream/raw", "shards-s3-webdataset/raw"} <= set(read["readers"])
        assert read["skipped"] == []
    if "plots" in LEGS[platform.leg]["extras"]:
        assert Path(read["plot"]).suffix == ".png"
    else:
        assert read["plot"] is None  # no matplotlib: the JSON report only


@pytest.mark.parametrize("platform", ["3.3-py3.12"], indirect=True)
def test_the_bulk_path_from_the_wheel_on_a_worker_without_build_tools(
    platform: Platform, cassandra_server: CassandraServer, s3_server: S3Server
) -> None:
    """`imgest bulk-helper install` with the wheel's prebuilt helper.jar and the locked jars fetched from a Maven
    repository (the local one, through file:// URLs, as from Maven Central through https), on a PATH with no javac,
    Maven or C compiler; then the generated sample into Cassandra through `--write-path bulk`: the helper ran (the
    job's log and summary say bulk) and verify_cassandra compared every row."""
    import shutil

    env = platform.env(s3_server)
    assert [shutil.which(t, path=env["PATH"]) for t in ("javac", "mvn", "gcc", "cc")] == [None] * 4
    assert shutil.which("java", path=env["PATH"])
    imgest = platform.venv / "bin" / "imgest"
    status = _run_unchecked(imgest, "bulk-helper", "status", env=env, cwd=platform.home)
    assert (status.returncode, "not installed" in status.stdout) == (1, True)  # the wheel's install put none in place
    m2 = Path.home() / ".m2" / "repository"  # where the dev install's Maven put the jars the lock names
    out = _run(imgest, "bulk-helper", "install", "--repository", m2.as_uri(), env=env, cwd=platform.home).stdout
    assert f"fetching 100 jars (69 MB) from {m2.as_uri()}" in out, out
    home = Path(out.strip().splitlines()[-1])
    assert home.is_relative_to(platform.venv / "share" / "imgest" / "bulk-helper")  # with the environment
    assert (home / "helper.jar").read_bytes() == _wheel_jar(platform)  # the wheel's jar, compiled at its build
    dataset = re.sub(r"\W", "", f"bulkwheel{platform.home.name}")
    conf = {"sample": True, "target": "cassandra", "dataset": dataset, "keyspace": dataset, "write_path": "bulk"}
    airflow = platform.venv / "bin" / "airflow"
    _run(imgest, "dags", "install", "--force", platform.home / "dags", env=env)
    _run(airflow, "db", "migrate", env=env, cwd=platform.home)
    proc = _run_unchecked(airflow, "dags", "test", "ingest_imagenet", "--conf", json.dumps(conf), env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    states = _states(platform.home / "airflow" / "airflow.db")
    for task in ("ingest_cassandra", "verify_cassandra", "build_split", "read_throughput"):
        assert states[task] == "success", (task, states)
    assert "write path: bulk (asked for (--write-path bulk))" in proc.stdout + proc.stderr
    from imgest.core.settings import CassandraSettings
    from imgest.sinks.cassandra.client import cassandra_session

    where = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    with cassandra_session(where) as session:
        assert session.execute(f"SELECT count(*) FROM {dataset}.data").one()[0] == DEMO_STORED


def _wheel_jar(platform: Platform) -> bytes:
    jar = next(platform.venv.glob("lib/python3.*/site-packages/imgest/sinks/cassandra/bulk/helper.jar"))
    return jar.read_bytes()


def _states(db: Path) -> dict[str, str | None]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute(  # of the latest run (a leg's tests run more than one)
            "SELECT task_id, state FROM task_instance WHERE dag_id = 'ingest_imagenet' AND run_id = "
            "(SELECT run_id FROM dag_run WHERE dag_id = 'ingest_imagenet' ORDER BY id DESC LIMIT 1)"
        ).fetchall()
    return dict(rows)


def _run_unchecked(*cmd: Any, **kw: Any) -> Any:
    import subprocess

    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, timeout=900, **kw)


def _xcom(db: Path, task_id: str) -> dict[str, Any]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT value FROM xcom WHERE dag_id = 'ingest_imagenet' AND task_id = ? AND key = 'return_value' "
            "ORDER BY timestamp DESC LIMIT 1",
            (task_id,),
        ).fetchone()
    return json.loads(row[0])
