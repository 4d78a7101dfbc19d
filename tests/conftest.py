"""Session fixtures for the real embedded services: reuse a running one, stop only what we started.

Also the suite's tiers and its skip policy:
- every test that asks (directly or through another fixture) for a service fixture is marked ``services``, so
  ``make test-quick`` (``-m "not services and not slow and not browser and not gpu"``) runs what needs no server;
- under ``CI`` a skip fails the test unless its reason is one these machines cannot meet (CI_ALLOWED_SKIPS): a
  check that names an engine or reader must run it;
- tests marked ``peers`` need the benchmark peers (LitData, OpenCV, simplejpeg: requirements/bench.txt, which
  ``make install-dev`` installs); without them they are deselected and the summary says so, except under ``CI``,
  where each fails;
- ``make test`` runs on two pytest-xdist workers (``-n 2 --dist loadscope``, tests/xdist_groups.py). Tests that
  share a server's state or a fixture wider than a test run on one worker, one after another (xdist_groups
  below). The workers share the embedded servers: the first to need one starts it under a file lock, a test on
  the Spark cluster holds it alone, and the controller stops what the workers started once both are done.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.services import AirflowServer, CassandraServer, S3Server, airflow_cli, get_service
from imgest.services.airflow_celery import CeleryAirflow
from imgest.services.base import Service
from imgest.services.embedded import use_embedded
from imgest.services.spark_cluster import SparkCluster
from imgest.services.spark_connect import SparkConnectServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.spark import driver_server
from tests import xdist_groups as groups
from tests.memory_watch import MemoryWatch
from tests.scheduler_fixture import scheduler, stop_after_last_user, uses_scheduler

SERVICE_FIXTURES = frozenset(
    {
        "cassandra_server",
        "cassandra_auth_server",
        "cassandra_tls_server",
        "cassandra_role",
        "spark_cluster",
        "spark_connect",
        "s3_server",
        "airflow_home",
        "airflow_scheduler",
        "airflow_celery",
    }
)
# Modules the install left uncompiled (scripts/install.sh: torch, packages' tests, build tools) are compiled once
# and kept, by this process and every process the suite starts, even where PYTHONDONTWRITEBYTECODE is set.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# Skip reasons CI accepts: what no machine of this project has. Anything else skipped under CI fails.
CI_ALLOWED_SKIPS = ("needs an NVIDIA GPU",)
# The suite's Spark jobs are small: their JVMs compile with C1 only, which halves the CPU a job's start costs
# on two cores (17 -> 10 -> 6 CPU seconds for a trivial job with the class-data archive, imgest.spark.cds).
os.environ.setdefault("IMGEST_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
# The test nodes' work is small too: C1 only and one GC thread of each kind. On 2 cores a node starts with 9 CPU
# seconds instead of 19, idles at 1.5 a minute instead of 2.8, and writes and reads 4,500 rows of 110 kB with
# 9 instead of 20 (C2's compiler threads were most of it). Nothing reads the JVM's perf data (jps, jstat).
os.environ.setdefault(
    "IMGEST_CASSANDRA_JAVA_OPTIONS",
    "-XX:TieredStopAtLevel=1 -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1 -XX:-UsePerfData",
)
# The suite's main node holds small tables: 2 GiB of heap and as much direct memory, not the quarter of the machine
# a user's node gets (cassandra_memory: 6 GiB + 6 GiB here). At 6 + 6 the node reached 6.8 GiB resident mid-suite
# and the kernel's OOM killer took it, beside Spark's and Airflow's processes, on a 24 GiB machine (CI of d1f1d27).
os.environ.setdefault("IMGEST_CASSANDRA_HEAP", "2G")
# The suite is a person who ran `eval "$(imgest services env)"`: the embedded stores' addresses and keys come from
# these variables (nothing in imgest falls back to 127.0.0.1 by itself). Tests of what happens without them unset them.
use_embedded()
# Local Spark jobs run one after another in one reused driver (imgest.spark.driver_server) instead of a
# spark-submit each: 5-20 s less per job, about seventy jobs. Tests of spark-submit itself call it directly;
# IMGEST_TEST_SPARK_SUBMIT=1 sends every job through spark-submit.
# Under pytest-xdist each worker has a driver of its own (the variable the controller set is replaced).
if os.environ.get("IMGEST_TEST_SPARK_SUBMIT") != "1":
    _socket = str(Path(tempfile.mkdtemp(prefix="imgest-driver-")) / "driver.sock")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[driver_server.SOCKET_ENV] = _socket
    else:
        os.environ.setdefault(driver_server.SOCKET_ENV, _socket)
# `airflow` commands (dags test, db migrate, connections) run in a warm process per Airflow home that imported
# Airflow once (imgest.services.airflow_cli): 8 CPU seconds less per `dags test`, about twenty commands.
# Under pytest-xdist each worker has servers of its own (the folder the controller set is replaced).
if os.environ.get("PYTEST_XDIST_WORKER") or not os.environ.get(airflow_cli.DIR_ENV):
    os.environ[airflow_cli.DIR_ENV] = tempfile.mkdtemp(prefix="imgest-airflow-cli-")
_PEERS_DROPPED = pytest.StashKey[int]()
# Passed from each xdist worker to the controller (config.workeroutput): services it started, tests it dropped.
_STARTED_KEY, _DROPPED_KEY = "imgest_started_services", "imgest_peers_dropped"
PEER_MODULES = ("litdata", "cv2", "simplejpeg")  # requirements/bench.txt: the benchmark peers' tests need them
_workers_started: set[str] = set()  # service names the workers started (the controller stops them at its end)
memory = MemoryWatch()  # the suite's lowest available memory and who held it (summary)
_workers_dropped = 0  # peer tests the workers deselected (the same number on each)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the reused Spark driver the session's jobs started, and remove its folder; in the xdist controller,
    stop the services the workers started (each worker has finished by now)."""
    path = driver_server.socket_path()
    if path is not None and path.parent.name.startswith("imgest-driver-"):
        driver_server.stop(path)
        shutil.rmtree(path.parent, ignore_errors=True)
    folder = Path(os.environ.get(airflow_cli.DIR_ENV, ""))
    if folder.name.startswith("imgest-airflow-cli-"):
        airflow_cli.stop_all(folder)
        shutil.rmtree(folder, ignore_errors=True)
    groups.finish()
    if _workers_started:
        stop_services([get_service(name) for name in sorted(_workers_started)])
        _workers_started.clear()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist controller: note what a finished worker started and dropped (its config.workeroutput)."""
    global _workers_dropped
    output = getattr(node, "workeroutput", None) or {}
    _workers_started.update(output.get(_STARTED_KEY, ()))
    _workers_dropped = max(_workers_dropped, int(output.get(_DROPPED_KEY, 0)))


def _module(item: pytest.Item) -> str:
    return groups.module_of(item.nodeid)


def pytest_configure(config: pytest.Config) -> None:
    groups.start(config)
    if not hasattr(config, "workeroutput"):  # the process that runs the session (xdist's controller, or the only)
        memory.start()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    memory.test_started(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist controller: schedule by the groups of xdist_groups (tests/xdist_groups.py)."""
    return groups.make_scheduler(config, log) if config.getvalue("dist") == "loadscope" else None


def xdist_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Module -> its group under ``make test``'s xdist (a group's tests run on one worker, in collection order).
    Whole modules, so that module fixtures run once: "airflow-celery" for the modules on the deployed shape (the
    browser, the Celery faults), "airflow-scheduler" for those on `airflow standalone` (refresh), "airflow-dags"
    for those on the `dags test` home, "readback" for tests/readback (one stored sample, one latency-proxy
    port), else the module alone. The Spark cluster is shared, one test at a time (_one_cluster_user)."""
    marks: dict[str, set[str]] = {}
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("browser") is not None:
            uses.add("airflow_celery")
        marks.setdefault(_module(item), set()).update(uses)
    group_of = {}
    for module, uses in marks.items():
        if "airflow_celery" in uses:
            group_of[module] = "airflow-celery"
        elif "airflow_scheduler" in uses:
            group_of[module] = "airflow-scheduler"
        elif "airflow_home" in uses:
            group_of[module] = "airflow-dags"
        else:
            group_of[module] = "readback" if module.startswith("tests/readback/") else module
    return group_of


def missing_peers() -> list[str]:
    """The benchmark peers' modules (requirements/bench.txt) that are not installed."""
    return [name for name in PEER_MODULES if importlib.util.find_spec(name) is None]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark service tests; deselect the benchmark-peer tests when the peers are not installed; order the tests by
    their xdist group and publish the groups to the controller (tests/xdist_groups.py)."""
    peers = not missing_peers() or bool(os.environ.get("CI"))  # CI: they run, or fail
    kept, dropped = [], []
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)
        (kept if peers or item.get_closest_marker("peers") is None else dropped).append(item)
    # Stable sorts: the two Airflow groups first (the longest), then the other groups with a service or a slow
    # test, then the rest, so that the two workers end together; the scheduler's users first of all.
    group_of = xdist_groups(kept)
    heavy = {group_of[_module(i)] for i in kept if i.get_closest_marker("services") or i.get_closest_marker("slow")}
    kept.sort(key=lambda item: not uses_scheduler(item))
    kept.sort(
        key=lambda item: (not group_of[_module(item)].startswith("airflow-"), group_of[_module(item)] not in heavy)
    )
    order: dict[str, int] = {}
    kept.sort(key=lambda item: order.setdefault(group_of[_module(item)], len(order)))
    groups.publish(group_of)
    items[:] = kept
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        config.stash[_PEERS_DROPPED] = len(dropped)
        if hasattr(config, "workeroutput"):
            config.workeroutput[_DROPPED_KEY] = len(dropped)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    memory.stop()
    for line in memory.summary():
        terminalreporter.write_line(line)
    dropped = config.stash.get(_PEERS_DROPPED, 0) or _workers_dropped
    if dropped:
        terminalreporter.write_line(
            f"{dropped} test(s) of the benchmark peers deselected: {', '.join(missing_peers())} not installed "
            "(make install-dev)"
        )


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_disallowed_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI, turn a skip whose reason is not in CI_ALLOWED_SKIPS into a failure naming what did not run."""
    if report.skipped and os.environ.get("CI") and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not any(allowed in reason for allowed in CI_ALLOWED_SKIPS):
            report.outcome = "failed"
            report.longrepr = (
                f"skipped under CI, where it must run: {reason}\n(CI accepts only skips for: "
                f"{', '.join(CI_ALLOWED_SKIPS)}; install what is missing or fix the machine)"
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A test's skip under CI (see _fail_disallowed_skip)."""
    report = yield
    _fail_disallowed_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A whole module's skip (pytest.importorskip at import, a module-level skip) under CI, likewise."""
    report = yield
    _fail_disallowed_skip(report)
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under CI a benchmark-peer test is not deselected: without LitData it fails here, saying so."""
    if item.get_closest_marker("peers") and missing_peers():
        pytest.fail(
            f"{', '.join(missing_peers())} not installed: CI runs the benchmark peers' tests (requirements/bench.txt, "
            "make install-dev)"
        )


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    stop_after_last_user(item, nextitem)
    uses = [getattr(i, "fixturenames", ()) for i in (item, nextitem) if i is not None]
    if "airflow_celery" in uses[0] and (len(uses) == 1 or "airflow_celery" not in uses[1]):
        while _celery_stoppers:  # the last test on the deployed shape ran (its group keeps them together)
            _celery_stoppers.pop()()


_celery_stoppers: list[Any] = []


@pytest.fixture(scope="session")
def airflow_celery(cassandra_server: CassandraServer, s3_server: S3Server) -> Iterator[CeleryAirflow]:
    """`imgest services up airflow-celery` (PostgreSQL, Redis, scheduler, API server, two Celery workers of their own
    hosts), shared by the browser and Celery tests; stopped after the last of them when this session started it."""
    deployment = CeleryAirflow.default()
    if deployment.up().started:
        _celery_stoppers.append(deployment.down)
    yield deployment
    while _celery_stoppers:
        _celery_stoppers.pop()()


@pytest.fixture(scope="session")
def airflow_scheduler(
    cassandra_server: CassandraServer, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AirflowServer]:
    """`airflow standalone` shared by the browser and refresh tests (tests/scheduler_fixture.py)."""
    yield from scheduler(tmp_path_factory)


started_services: list[Service] = []  # started by this process, used by its tests only: stopped at its end
shared_started: list[str] = []  # imgest.services names this process started for every worker (serve)


def stop_services(services: list[Service]) -> None:
    """Stop SERVICES together (each drains while the others do; one after another took 25 s of the suite)."""
    with ThreadPoolExecutor(max_workers=max(1, len(services))) as pool:
        list(pool.map(lambda service: service.down(), services))


@pytest.fixture(scope="session", autouse=True)
def _stop_started_services(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up first, torn down last: the services this session started stop together. An xdist worker hands
    the shared ones to the controller instead, which stops them after the last worker (the other may still use
    them)."""
    yield
    workeroutput = getattr(request.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_STARTED_KEY] = list(shared_started)
        stop_services(started_services)
    else:
        stop_services([*started_services, *map(get_service, shared_started)])
    started_services.clear()
    shared_started.clear()


@contextmanager
def _file_lock(name: str) -> Iterator[None]:
    """Hold .imgest/test-locks/NAME.lock (flock) for the block: one holder among the session's xdist workers."""
    locks = state_dir() / "test-locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def serve(wanted: str | Service) -> Iterator[Service]:
    """Yield the service WANTED, started if it was not answering; stopped at the session's end only if this
    session started it. A name (imgest.services.get_service) is a server every xdist worker may use: the check
    and the start hold a file lock, so that it starts once, and the controller stops it after both workers. A
    service object is one group's own (tests/xdist_groups.py): its worker stops it."""
    service = get_service(wanted) if isinstance(wanted, str) else wanted
    with _file_lock(service.name):
        if not service.answers():
            result = service.up()
            if result.started:
                if isinstance(wanted, str):
                    shared_started.append(wanted)
                else:
                    started_services.append(service)
            print(f"\n[fixture] {result.message}")
    yield service


@pytest.fixture(scope="session")
def cassandra_server() -> Iterator[CassandraServer]:
    """The embedded Cassandra node (AllowAllAuthenticator) on 127.0.0.1."""
    yield from serve("cassandra")  # type: ignore[misc]


@pytest.fixture(scope="session")
def cassandra_auth_server() -> Iterator[CassandraServer]:
    """A second node with PasswordAuthenticator (superuser cassandra/cassandra)."""
    yield from serve("cassandra-auth")  # type: ignore[misc]


@pytest.fixture(scope="module")
def cassandra_tls_server() -> Iterator[CassandraServer]:
    """A node that speaks TLS only on its native port, with a CA and certificate made at its first start. One
    module uses it: started for that module, stopped at its end if this started it (an idle node costs 2.5 CPU
    seconds a minute)."""
    server = CassandraServer.default(tls=True)
    started = not server.answers() and server.up().started
    yield server
    if started:
        server.down()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """The Spark standalone master and its two clean workers."""
    yield from serve("spark")  # type: ignore[misc]


@pytest.fixture(scope="session")
def spark_connect(spark_cluster: SparkCluster) -> Iterator[SparkConnectServer]:
    """The Spark Connect server on the suite's cluster, shared by both xdist workers and stopped by the controller
    at the end (idle, its executors go back to the cluster after 15 s). Started and stopped per module, one
    worker's module stopped the server the other's had found answering, mid-test (CI of bb0371c)."""
    yield from serve("spark-connect")  # type: ignore[misc]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The embedded SeaweedFS S3 server with enforced keys."""
    yield from serve("s3")  # type: ignore[misc]


@pytest.fixture(scope="session")
def airflow_home(cassandra_server: CassandraServer, s3_server: S3Server) -> AirflowServer:
    """A migrated AIRFLOW_HOME whose connections point at the embedded services, for `airflow dags test`. It is
    not the home of `airflow standalone` (airflow_scheduler), whose scheduler would take over the runs `dags test`
    makes: the two run at once on two xdist workers."""
    server = AirflowServer(home=state_dir() / "airflow-dags-test")
    server.prepare(cassandra_server, s3_server)
    return server


@pytest.fixture(autouse=True)
def _one_cluster_user(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the Spark cluster has it to itself (a file lock across xdist workers): its two one-core workers
    would otherwise queue one test's application behind the other's, and the process watch would see both."""
    if "spark_cluster" not in request.fixturenames:
        yield
        return
    with _file_lock("spark-cluster-user"):
        yield


@pytest.fixture(autouse=True)
def _no_process_cassandra_left() -> Iterator[None]:
    """The Cassandra settings a CLI command gives its process's lock stores (``lock_stores.use_cassandra``) end with
    the test: a later test's lock store in the same worker would otherwise reach the earlier test's node (the TLS
    node on 9242, stopped by then) whatever its URL names."""
    from imgest.core import lock_stores

    before = dict(lock_stores._PROCESS)
    yield
    lock_stores._PROCESS.clear()
    lock_stores._PROCESS.update(before)


@pytest.fixture(scope="session")
def cassandra_role(cassandra_auth_server: CassandraServer) -> tuple[CassandraSettings, str]:
    """A login role with a random password on the password-checking node: (settings, password)."""
    role, password = f"imgest_test_{secrets.token_hex(4)}", "pw" + secrets.token_hex(12)
    admin = CassandraSettings(
        hosts=(cassandra_auth_server.host,),
        port=cassandra_auth_server.native_port,
        username="cassandra",
        password="cassandra",
    )
    with cassandra_session(admin) as session:
        session.execute(f"CREATE ROLE {role} WITH LOGIN = true AND SUPERUSER = true AND PASSWORD = '{password}'")
    return CassandraSettings(
        hosts=(cassandra_auth_server.host,), port=cassandra_auth_server.native_port, username=role, password=password
    ), password


@pytest.fixture
def event_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """spark-submit reads SPARK_CONF_DIR/spark-defaults.conf: the event log goes to a folder of this test."""
    conf, events = tmp_path / "spark-conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    return events
