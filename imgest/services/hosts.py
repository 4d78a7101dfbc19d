"""``imgest services up hosts``: the whole deployment on simulated hosts that share nothing but a network.

Seven hosts, each a network namespace on one bridge (``10.213.0.0/24``; ``IMGEST_HOSTS_SUBNET`` names another /24 by
its first three octets) with its own host name, /etc/hosts naming every host, empty state folder and /tmp
(imgest.services.hosts_net): ``store`` (Cassandra, the strict AWS: S3, IAM and STS, PostgreSQL, Redis), ``control``
(Airflow's API server, scheduler, DAG processor and triggerer, CeleryExecutor), ``worker-a`` and ``worker-b`` (a
Celery worker each, the Spark drivers), ``spark-master``, ``spark-1`` and ``spark-2`` (Spark standalone, one core
per worker). Nothing listens on 127.0.0.1 in any host except Airflow's log servers (which bind every address); no
route leads off the subnet. The bridge's own address in the root namespace lets a person open the Airflow UI.

Airflow's processes get the stores only as AIRFLOW_CONN_* variables and IMGEST_STATE_URL (run state in the store
host's S3), never a 127.0.0.1 default; the deployer (this module, in the root namespace) keeps the shared secrets
under ``$IMGEST_HOME/hosts/deployer``, which no host sees. No host holds an S3 key: each has a web identity of its
own, exchanged at STS for its role's temporary keys, as pods with IRSA (imgest.services.hosts_aws). Needs root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.core.paths import repo_root, state_dir
from imgest.services.airflow import SPARK_POOL
from imgest.services.airflow_celery import COMPONENTS
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.cassandra import cassandra_version, jars_dir
from imgest.services.hosts_aws import HostAws, bootstrap, identity_env
from imgest.services.hosts_net import HostView, Network, SimHost, in_host, net_down, net_up, prepare_view
from imgest.services.hosts_servers import (
    CELERY_WORKER,
    HostAirflow,
    HostCassandra,
    HostPostgres,
    HostRedis,
    HostSparkConnect,
    HostSparkMaster,
    HostSparkWorker,
    venv_path,
)
from imgest.services.metadb import PostgresServer, RedisServer
from imgest.services.process import ManagedProcess, stop_all
from imgest.services.strict_aws import REGION, moto_binary

LAYOUT = (  # name, last octet of its address, what runs there
    ("store", 10, "Cassandra :9042, AWS (moto: S3, IAM, STS) :5050, PostgreSQL :5432, Redis :6379"),
    ("control", 11, "Airflow api-server :8080, scheduler, dag-processor, triggerer (CeleryExecutor)"),
    ("worker-a", 21, "Celery worker (Spark driver, client mode)"),
    ("worker-b", 22, "Celery worker (Spark driver, client mode)"),
    ("spark-master", 30, "Spark standalone master :7077, UI :8090, Spark Connect :15002"),
    ("spark-1", 31, "Spark worker, 1 core, UI :8091"),
    ("spark-2", 32, "Spark worker, 1 core, UI :8091"),
)
WORKER_HOSTS = ("worker-a", "worker-b")
SPARK_WORKER_HOSTS = ("spark-1", "spark-2")
AIRFLOW_PORT, CASSANDRA_PORT, AWS_PORT, PG_PORT, REDIS_PORT = 8080, 9042, 5050, 5432, 6379
SPARK_PORT, SPARK_UI_PORT, SPARK_WORKER_UI_PORT, CONNECT_PORT = 7077, 8090, 8091, 15002
STATE_URL = "s3://imgest/_hosts"
DATASETS_FILE = "config/datasets.toml"  # under each Airflow host's own state folder
PASSED_ON = ("JAVA_HOME", "IMGEST_SPARK_JAVA_OPTIONS", "IMGEST_JVM_CDS")  # the deployer's JVM settings, no address


@dataclass(frozen=True)
class SimulatedHosts:
    """The deployment on hosts of its own, its files under STATE/hosts (STATE: the root machine's state folder)."""

    state: Path
    subnet: str = "10.213.0"
    bridge: str = "imgest-hosts"
    name: str = "hosts"
    spark_route: str = "spark"  # what the Airflow hosts' spark_default names: "spark" (spark-submit) or "connect"

    @classmethod
    def default(cls) -> SimulatedHosts:
        return cls(state=state_dir(), subnet=os.environ.get("IMGEST_HOSTS_SUBNET", "10.213.0"))

    # ------------------------------------------------------------------------------------------ hosts and views
    @property
    def network(self) -> Network:
        hosts = tuple(SimHost(name, f"{self.subnet}.{octet}") for name, octet, _ in LAYOUT)
        return Network(self.bridge, self.subnet, hosts)

    def address(self, host: str) -> str:
        """HOST's address on the bridge."""
        return self.network.host(host).address

    @property
    def root(self) -> Path:
        return self.state / "hosts"

    def own(self, host: str) -> Path:
        """HOST's own state folder (root view; inside the host it is also at the state folder's path)."""
        return self.root / host / "home"

    def view(self, host: str) -> HostView:
        """What HOST sees: its own folder, its /etc/hosts; the store host also the Cassandra jars (read-only, at
        their path, when the state folder holds them: its own folder covers that)."""
        own, jars, moto = self.own(host), jars_dir(), moto_binary().parent.parent
        installed = (jars, moto) if host == "store" else ()  # read-only, as installed packages are
        binds = tuple((p, own / p.relative_to(self.state)) for p in installed if p.is_relative_to(self.state))
        visible = (repo_root() or self.state, Path(sys.prefix))  # a checkout in /tmp: the code and venv it runs
        return HostView(self.state, own, self.root / host / "etc-hosts", binds, visible)

    def prefix(self, host: str) -> tuple[str, ...]:
        """The command prefix that runs a program inside HOST."""
        return tuple(in_host(self.network.host(host), self.view(host)))

    def env(self, host: str) -> dict[str, str]:
        """HOST's whole environment: the venv on PATH, IMGEST_HOME at the state folder's path (its own disk there,
        as every pod mounts its disk at one path: tasks pass paths under it to each other), HOME and TMPDIR its own;
        Airflow hosts add the connections."""
        own = self.own(host)
        env = {"PATH": venv_path(), "HOME": str(own), "LANG": "C.UTF-8", "IMGEST_HOME": str(self.state)}
        env["TMPDIR"] = str(self.view(host).tmp)
        env.update({k: os.environ[k] for k in PASSED_ON if os.environ.get(k)})
        if host != "store":  # a web identity of its own, no key
            env.update(identity_env(host, self.state, self.aws_endpoint, REGION))
        if host == "control" or host in WORKER_HOSTS:
            env.update(self.airflow_env(host))
        return env

    def airflow_env(self, host: str) -> dict[str, str]:
        """What an Airflow process on HOST adds: its AIRFLOW_HOME, the connections, the run state's store; a worker
        (a Spark driver) binds and advertises its own address."""
        env = {
            "AIRFLOW_HOME": str(self.own(host) / "airflow"),
            "IMGEST_DATASETS_FILE": str(self.state / DATASETS_FILE),  # each host's own copy (a mounted config map)
            "IMGEST_STATE_URL": STATE_URL,
            "IMGEST_SPARK_POOL": SPARK_POOL,
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            **{f"AIRFLOW_CONN_{k.upper()}": json.dumps(v) for k, v in self.connections().items()},
        }
        if host in WORKER_HOSTS:
            env["SPARK_LOCAL_IP"] = env["SPARK_LOCAL_HOSTNAME"] = self.address(host)
        return env

    def connections(self) -> dict[str, dict[str, object]]:
        """cassandra_default, aws_default and spark_default, all on the hosts' addresses (Airflow's JSON form);
        aws_default names no key: each host's web identity signs."""
        return {
            "cassandra_default": {"conn_type": "cassandra", "host": self.address("store"), "port": CASSANDRA_PORT},
            "aws_default": {"conn_type": "aws", "extra": {"endpoint_url": self.aws_endpoint, "region_name": REGION}},
            "spark_default": {
                "conn_type": "spark",
                "host": f"spark://{self.address('spark-master')}",
                "port": SPARK_PORT,
                "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
            }
            if self.spark_route == "spark"
            else {"conn_type": "spark_connect", "host": self.address("spark-master"), "port": CONNECT_PORT},
        }

    def run_in(
        self, host: str, argv: list[str], timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ARGV to its end inside HOST with ENV (default: HOST's environment; output captured)."""
        cmd = [*self.prefix(host), *argv]
        env = self.env(host) if env is None else env
        return subprocess.run(cmd, env=env, text=True, capture_output=True, check=False, timeout=timeout)

    def base_env(self, host: str) -> dict[str, str]:
        """HOST's environment without Airflow's settings (a person's shell there: no connection, no store)."""
        env = {k: v for k, v in self.env(host).items() if not k.startswith(("AIRFLOW", "IMGEST_STATE_URL"))}
        if host in WORKER_HOSTS:  # a Spark driver binds and advertises its own address
            env["SPARK_LOCAL_IP"] = env["SPARK_LOCAL_HOSTNAME"] = self.address(host)
        return env

    def register_datasets(self, toml: str) -> None:
        """The datasets file (refresh_<name> DAGs) of every Airflow host: each host's own copy, at one path."""
        for host in ("control", *WORKER_HOSTS):
            path = self.own(host) / DATASETS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(toml)

    # ------------------------------------------------------------------------------------------------ servers
    def _in(self, host: str) -> dict[str, object]:
        return {"prefix": self.prefix(host), "environ": self.env(host)}

    def cassandra(self) -> HostCassandra:
        store = self.address("store")
        home = self.own("store") / "cassandra"
        return HostCassandra(home, native_port=CASSANDRA_PORT, storage_port=7000, host=store, **self._in("store"))

    def aws(self) -> HostAws:
        return HostAws(self.own("store") / "aws", port=AWS_PORT, host=self.address("store"), **self._in("store"))

    @property
    def aws_endpoint(self) -> str:
        return f"http://{self.address('store')}:{AWS_PORT}"

    def backends(self) -> tuple[HostPostgres, HostRedis]:
        """PostgreSQL (Airflow's metadata) and Redis (Celery's broker) on the store host, passwords kept by the
        deployer."""
        home, store = self.own("store") / "airflow-db", self.address("store")
        passwords = HostAirflow(home=self.deployer)._passwords()
        tmp = self.view("store").tmp
        pg = HostPostgres(
            home,
            PG_PORT,
            passwords["postgres"],
            host=store,
            host_tmp=tmp,
            clients=f"{self.subnet}.0/24",
            **self._in("store"),
        )
        return pg, HostRedis(home, REDIS_PORT, passwords["redis"], host=store, **self._in("store"))

    @property
    def deployer(self) -> Path:
        """The deployer's folder (root namespace only): the deployment's shared secrets."""
        return self.root / "deployer"

    def airflow(self, host: str = "control") -> HostAirflow:
        """The Airflow of HOST (control or a worker host): the deployment's config in that host's AIRFLOW_HOME."""
        pg, redis = self.backends()
        metadb = PostgresServer(pg.home, pg.port, pg.password, host=pg.host)
        broker = RedisServer(redis.home, redis.port, redis.password, host=redis.host)
        home = self.own(host) / "airflow"
        return HostAirflow(
            home=home,
            port=AIRFLOW_PORT,
            host=self.address("control"),
            secrets_home=self.deployer,
            metadb=metadb,
            broker=broker,
            **self._in(host),
        )

    def spark_master(self) -> HostSparkMaster:
        home = self.own("spark-master") / "spark"
        master = self.address("spark-master")
        return HostSparkMaster(
            home, SPARK_PORT, SPARK_UI_PORT, len(SPARK_WORKER_HOSTS), host=master, **self._in("spark-master")
        )

    def spark_connect(self) -> HostSparkConnect:
        home, master = self.own("spark-master") / "spark-connect", self.spark_master()
        return HostSparkConnect(home, master, CONNECT_PORT, master.host, **self._in("spark-master"))

    def spark_worker(self, host: str) -> HostSparkWorker:
        home = self.own(host) / "spark-worker"
        url = self.spark_master().master_url
        return HostSparkWorker(home, self.address(host), url, ui_port=SPARK_WORKER_UI_PORT, **self._in(host))

    def processes(self) -> list[ManagedProcess]:
        """Every long-running process of the deployment except the backends, Airflow's first."""
        procs = [self.airflow(h).process_of(CELERY_WORKER) for h in WORKER_HOSTS]
        procs += [self.airflow().process_of(c) for c in COMPONENTS]
        procs += [self.spark_worker(h).process for h in SPARK_WORKER_HOSTS]
        procs.append(self.spark_connect().process)
        return [*procs, self.spark_master().process(), self.aws().process, self.cassandra().process]

    # ---------------------------------------------------------------------------------------------- lifecycle
    def up(self, timeout: float = 300.0) -> UpResult:
        """Create the hosts and start every server in its host; wait until each answers. A failure stops what was
        started and deletes the hosts."""
        if os.geteuid() != 0:
            raise ServiceError("hosts: needs root (network namespaces, bridges, mounts); run as root")
        if self.answers():
            return UpResult(self.name, False, 0.0, "hosts already running\n" + self.summary())
        t0 = time.monotonic()
        try:
            self._create_hosts()
            note = self.cassandra().launch()  # the slowest to start: it warms up while the others start
            self._start_backends()
            self._start_spark()
            self._start_airflow(timeout)
            self.cassandra().wait_up(timeout, note)
            self._wait_spark(timeout)
        except BaseException:
            self.down()
            raise
        return UpResult(self.name, True, time.monotonic() - t0, self.summary(time.monotonic() - t0))

    def _create_hosts(self) -> None:
        net = self.network
        net_up(net)
        self.deployer.mkdir(mode=0o700, parents=True, exist_ok=True)
        for host in net.hosts:
            prepare_view(net, self.view(host.name))

    def _start_backends(self) -> None:
        self.aws().up()
        bootstrap(self.aws(), {name: self.own(name) for name, _, _ in LAYOUT if name != "store"})
        pg, redis = self.backends()
        pg.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        pg.up()
        redis.up()

    def _start_spark(self) -> None:
        master = self.spark_master()
        master.start_master()
        master.process().wait_ready(lambda: master.master_state() is not None, 120, "on its web UI")
        for host in SPARK_WORKER_HOSTS:
            self.spark_worker(host).start()
        self.spark_connect().start()

    def _wait_spark(self, timeout: float) -> None:
        master = self.spark_master()
        master.process().wait_ready(master.answers, timeout, "with both workers registered")
        connect = self.spark_connect()
        connect.process.wait_ready(connect.answers, timeout, f"on {connect.url}")

    def restart_celery_workers(self) -> None:
        """Stop each Celery worker and start it again with this deployment's environment (its spark_route)."""
        for host in WORKER_HOSTS:
            worker = self.airflow(host)
            worker.process_of(CELERY_WORKER).stop(timeout=60)
            worker.process_of(CELERY_WORKER).start(worker.command(CELERY_WORKER), cwd=worker.home)

    def _start_airflow(self, timeout: float) -> None:
        control = self.airflow()
        for host in ("control", *WORKER_HOSTS):
            self.airflow(host).write_config()
        control.prepare_db()
        for component in COMPONENTS:
            if control.process_of(component).pid() is None:
                control.process_of(component).start(control.command(component), cwd=control.home)
        for host in WORKER_HOSTS:
            worker = self.airflow(host)
            if worker.process_of(CELERY_WORKER).pid() is None:
                worker.process_of(CELERY_WORKER).start(worker.command(CELERY_WORKER), cwd=worker.home)
        control.process_of("api-server").wait_ready(control.answers, timeout, f"HTTP on {control.url}")
        control.warm_execution_api()
        for host in ("control", *WORKER_HOSTS):
            self.airflow(host).tighten()

    def down(self) -> bool:
        """Stop every process of the deployment, then delete the hosts (namespaces, veths, bridge); True if
        anything was running or existed. Safe after a partial start."""
        if not self.deployer.is_dir():  # never started here: only namespaces a failed start left, if any
            return net_down(self.network)
        stopped = any(stop_all(self.processes(), timeout=60))
        stopped = any([stopped, *(server.down() for server in reversed(self.backends()))])
        stopped = self._kill_leftovers() or stopped
        return net_down(self.network) or stopped

    def wipe(self) -> None:
        """Stop the deployment and delete every host's disk (the next `up` starts from empty disks)."""
        import shutil

        self.down()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftovers(self) -> bool:
        """SIGKILL whatever still runs in the hosts' namespaces (only this deployment puts processes there)."""
        import contextlib
        import signal

        found = False
        for host in self.network.hosts:
            done = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=False)
            for pid in (int(p) for p in done.stdout.split() if p.isdigit()):
                found = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return found

    # ----------------------------------------------------------------------------------------------- queries
    def answers(self) -> bool:
        """Every server answers at its host's address."""
        if not Path("/sys/class/net", self.bridge).exists() or not self.deployer.is_dir():
            return False
        pg, redis = self.backends()
        parts = (self.airflow(), self.spark_master(), pg, redis, self.aws(), self.cassandra())
        return all(part.answers() for part in parts)

    def status(self) -> ServiceStatus:
        """One line: the UI's address, the API server's PID and which processes run."""
        if not self.deployer.is_dir():
            return ServiceStatus(self.name, f"http://{self.address('control')}:{AIRFLOW_PORT}", None, False)
        procs = [*self.processes(), *(server.process for server in self.backends())]
        parts = {p.name + "@" + self._host_of(p): p.pid() for p in procs}
        detail = " ".join(f"{name}={pid or 'down'}" for name, pid in parts.items())
        api = self.airflow().process_of("api-server").pid()
        up = Path("/sys/class/net", self.bridge).exists() and self.airflow().answers()
        return ServiceStatus(self.name, self.airflow().url, api, up, detail)

    def _host_of(self, proc: ManagedProcess) -> str:
        return proc.pid_file.relative_to(self.root).parts[0]

    def summary(self, seconds: float | None = None) -> str:
        """Each host, its address and what runs there; the UI's address and login."""
        control = self.airflow()
        took = f" after {seconds:.1f}s" if seconds is not None else ""
        lines = [f"hosts up{took} on bridge {self.bridge} ({self.subnet}.0/24, this machine: {self.network.gateway}):"]
        lines += [f"  {name:<13} {self.address(name):<13} {what}" for name, _, what in LAYOUT]
        lines.append(f"  Airflow UI {control.url} (login {control.login()}); Cassandra {cassandra_version()}")
        lines.append(f"  run state {STATE_URL}; files under {self.root}; S3 keys: none, a web identity per host")
        return "\n".join(lines)
