"""Session fixtures for the real embedded services: reuse a running one, stop only what we started.

Also the suite's tiers and its skip policy:
- every test that asks (directly or through another fixture) for a service fixture is marked ``services``, so
  ``make test-quick`` (``-m "not services and not slow and not browser and not gpu"``) runs what needs no server;
- under ``CI`` a skip fails the test unless its reason is one these machines cannot meet (CI_ALLOWED_SKIPS): a
  check that names an engine or reader must run it;
- tests marked ``peers`` need the benchmark peers (``make install-bench``); without them they are deselected,
  and the summary says so.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.services.base import Service
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session
from imgest.spark import driver_server
from tests.scheduler_fixture import scheduler, stop_after_last_user, uses_scheduler

SERVICE_FIXTURES = frozenset(
    {
        "cassandra_server",
        "cassandra_auth_server",
        "cassandra_tls_server",
        "cassandra_role",
        "spark_cluster",
        "s3_server",
        "airflow_home",
        "airflow_scheduler",
    }
)
# Skip reasons CI accepts: what no machine of this project has. Anything else skipped under CI fails.
CI_ALLOWED_SKIPS = ("needs an NVIDIA GPU",)
# The suite's Spark jobs are small: their JVMs compile with C1 only, which halves the CPU a job's start costs
# on two cores (17 -> 10 -> 6 CPU seconds for a trivial job with the class-data archive, imgest.spark.cds).
os.environ.setdefault("IMGEST_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
# Local Spark jobs run one after another in one reused driver (imgest.spark.driver_server) instead of a
# spark-submit each: 5-20 s less per job, about seventy jobs. Tests of spark-submit itself call it directly;
# IMGEST_TEST_SPARK_SUBMIT=1 sends every job through spark-submit.
if os.environ.get("IMGEST_TEST_SPARK_SUBMIT") != "1":
    os.environ.setdefault(
        driver_server.SOCKET_ENV, str(Path(tempfile.mkdtemp(prefix="imgest-driver-")) / "driver.sock")
    )
_PEERS_DROPPED = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the reused Spark driver the session's jobs started, and remove its folder."""
    path = driver_server.socket_path()
    if path is not None and path.parent.name.startswith("imgest-driver-"):
        driver_server.stop(path)
        shutil.rmtree(path.parent, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark service tests; deselect the benchmark-peer tests when the peers are not installed."""
    peers = importlib.util.find_spec("litdata") is not None
    items.sort(key=lambda item: not uses_scheduler(item))  # stable: the scheduler's users run together, first
    kept, dropped = [], []
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)
        (kept if peers or item.get_closest_marker("peers") is None else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        config.stash[_PEERS_DROPPED] = len(dropped)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    dropped = config.stash.get(_PEERS_DROPPED, 0)
    if dropped:
        terminalreporter.write_line(
            f"{dropped} test(s) of the benchmark peers deselected: LitData is not installed (make install-bench)"
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


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    stop_after_last_user(item, nextitem)


@pytest.fixture(scope="session")
def airflow_scheduler(
    cassandra_server: CassandraServer, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AirflowServer]:
    """`airflow standalone` shared by the browser and refresh tests (tests/scheduler_fixture.py)."""
    yield from scheduler(tmp_path_factory)


started_services: list[Service] = []  # stopped together when the session ends


@pytest.fixture(scope="session", autouse=True)
def _stop_started_services() -> Iterator[None]:
    """Set up first, torn down last: the services this session started stop together (each drains while the
    others do; one after another took 25 s of the suite)."""
    yield
    with ThreadPoolExecutor(max_workers=max(1, len(started_services))) as pool:
        list(pool.map(lambda service: service.down(), started_services))
    started_services.clear()


def serve(service: Service) -> Iterator[Service]:
    """Yield SERVICE, started if it was not answering; stopped at the session's end only if this started it."""
    if not service.answers():
        result = service.up()
        if result.started:
            started_services.append(service)
        print(f"\n[fixture] {result.message}")
    yield service


@pytest.fixture(scope="session")
def cassandra_server() -> Iterator[CassandraServer]:
    """The embedded Cassandra node (AllowAllAuthenticator) on 127.0.0.1."""
    yield from serve(CassandraServer.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def cassandra_auth_server() -> Iterator[CassandraServer]:
    """A second node with PasswordAuthenticator (superuser cassandra/cassandra)."""
    yield from serve(CassandraServer.default(auth=True))  # type: ignore[misc]


@pytest.fixture(scope="session")
def cassandra_tls_server() -> Iterator[CassandraServer]:
    """A node that speaks TLS only on its native port, with a CA and certificate made at its first start."""
    yield from serve(CassandraServer.default(tls=True))  # type: ignore[misc]


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """The Spark standalone master and its two clean workers."""
    yield from serve(SparkCluster.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The embedded SeaweedFS S3 server with enforced keys."""
    yield from serve(S3Server.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def airflow_home(cassandra_server: CassandraServer, s3_server: S3Server) -> AirflowServer:
    """A migrated AIRFLOW_HOME whose connections point at the embedded services (no scheduler)."""
    server = AirflowServer.default()
    if server.answers():  # e.g. left by a killed run: its scheduler would take over the runs `dags test` makes
        print(f"\n[fixture] stopping the airflow standalone found running on {server.home}")
        server.down()
    server.prepare(cassandra_server, s3_server)
    return server


@pytest.fixture(scope="session")
def cassandra_role(cassandra_auth_server: CassandraServer) -> tuple[CassandraSettings, str]:
    """A login role with a random password on the password-checking node: (settings, password)."""
    role, password = f"imgest_test_{secrets.token_hex(4)}", "pw" + secrets.token_hex(12)
    admin = CassandraSettings(port=cassandra_auth_server.native_port, username="cassandra", password="cassandra")
    with cassandra_session(admin) as session:
        session.execute(f"CREATE ROLE {role} WITH LOGIN = true AND SUPERUSER = true AND PASSWORD = '{password}'")
    return CassandraSettings(port=cassandra_auth_server.native_port, username=role, password=password), password


@pytest.fixture
def event_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """spark-submit reads SPARK_CONF_DIR/spark-defaults.conf: the event log goes to a folder of this test."""
    conf, events = tmp_path / "spark-conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    return events
