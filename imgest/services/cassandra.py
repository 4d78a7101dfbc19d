"""Embedded Apache Cassandra 5.0: jars from Maven Central, one JVM on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from imgest.core import jvmcds
from imgest.core.errors import ServiceError
from imgest.core.paths import conf_file, state_dir
from imgest.core.settings import EMBEDDED_HOST, env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.cassandra_memory import SMALL_NODE_HEAP, main_node_heap, memory_flags
from imgest.services.process import ManagedProcess, port_open, require_free_port, which_or_fail

log = logging.getLogger(__name__)

DAEMON_CLASS = "org.apache.cassandra.service.CassandraDaemon"
JARS_MARKER = ".resolved"


def cassandra_version() -> str:
    """The Cassandra version pinned in services/conf/pom.xml."""
    match = re.search(r"<cassandra.version>([^<]+)</cassandra.version>", conf_file("pom.xml").read_text())
    if match is None:
        raise ServiceError(f"cassandra: no <cassandra.version> in {conf_file('pom.xml')}")
    return match.group(1)


def jars_dir() -> Path:
    """Ignored folder holding the resolved server jars, shared by every local instance."""
    return state_dir() / "cassandra-lib" / cassandra_version()


def resolve_jars(lib: Path | None = None) -> tuple[Path, bool]:
    """Resolve cassandra-all and its runtime dependencies with Maven into LIB (once).

    Returns (folder, resolved_now). A second call finds the marker file and resolves nothing.
    """
    lib = lib or jars_dir()
    if (lib / JARS_MARKER).is_file():
        return lib, False
    mvn = which_or_fail("cassandra", "mvn", "install Apache Maven (Debian: apt-get install maven)")
    tmp = lib.with_name(lib.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    log_file = state_dir() / "logs" / "cassandra-maven.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(conf_file("pom.xml")),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    log.info("resolving Cassandra %s jars from Maven Central into %s", cassandra_version(), lib)
    with open(log_file, "wb") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0 or not any(tmp.glob("cassandra-all-*.jar")):
        raise ServiceError(f"cassandra: Maven could not resolve cassandra-all (exit {rc}); read {log_file}")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
    (lib / JARS_MARKER).write_text(cassandra_version() + "\n")
    return lib, True


def jvm_options() -> list[str]:
    """Flags from services/conf/jvm17-server.options (Cassandra's own Java 17 set; the heap is the node's)."""
    lines = conf_file("jvm17-server.options").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


@dataclass(frozen=True)
class CassandraServer:
    """One local Cassandra node. AUTH enables PasswordAuthenticator (user cassandra/cassandra)."""

    home: Path
    native_port: int = 9042
    storage_port: int = 7000
    auth: bool = False
    host: str = EMBEDDED_HOST
    name: str = "cassandra"
    seeds: str = ""  # host:storage_port of the seed nodes; default: this node alone
    cluster: str = "imgest"
    jmx_port: int = 0  # local-only JMX for nodetool (ring nodes); 0: none
    token_rf: int = 1  # replication factor the token allocator optimises for
    initial_tokens: tuple[int, ...] = ()  # fixed tokens (one per vnode): joins without bootstrap, see token_config
    ring_delay_ms: int = 1000  # how long gossip waits for peers; a joining ring node on a busy box needs more
    tls: bool = False  # TLS required on the native port, with a CA and certificate made in <home>/tls
    broadcast_rpc: str = ""  # the address clients are told to use for this node (a proxy in front of it); "": host
    heap: int = SMALL_NODE_HEAP  # bytes of heap and as much direct memory (cassandra_memory); main node: by machine
    jvm_flags: tuple[str, ...] = ()  # more JVM flags (system properties) of this node's daemon

    @classmethod
    def default(cls, auth: bool = False, tls: bool = False) -> CassandraServer:
        """The embedded node; the auth-enabled and the TLS-only ones live beside it on their own ports."""
        if tls:
            return cls(
                home=state_dir() / "cassandra-tls",
                native_port=env_int("IMGEST_CASSANDRA_TLS_PORT", 9242),
                storage_port=env_int("IMGEST_CASSANDRA_TLS_STORAGE_PORT", 7300),
                tls=True,
                name="cassandra-tls",
            )
        if auth:
            return cls(
                home=state_dir() / "cassandra-auth",
                native_port=env_int("IMGEST_CASSANDRA_AUTH_PORT", 9142),
                storage_port=env_int("IMGEST_CASSANDRA_AUTH_STORAGE_PORT", 7100),
                auth=True,
                name="cassandra-auth",
            )
        return cls(
            home=state_dir() / "cassandra",
            native_port=env_int("IMGEST_CASSANDRA_PORT", 9042),
            storage_port=env_int("IMGEST_CASSANDRA_STORAGE_PORT", 7000),
            jmx_port=env_int("IMGEST_CASSANDRA_JMX_PORT", 7199),  # Cassandra's own default, local only
            heap=main_node_heap(),
        )

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "cassandra.pid", self.home / "logs" / "stdout.log")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.native_port}"

    def render_config(self) -> Path:
        """Write cassandra.yaml for this node (ports, authenticator) from the repo's template."""
        text = Template(conf_file("cassandra.yaml").read_text()).substitute(
            cluster_name=self.cluster,
            host=self.host,
            seeds=self.seeds or f"{self.host}:{self.storage_port}",
            token_config=self.token_config(),
            native_port=self.native_port,
            storage_port=self.storage_port,
            authenticator="PasswordAuthenticator" if self.auth else "AllowAllAuthenticator",
            authorizer="CassandraAuthorizer" if self.auth else "AllowAllAuthorizer",
        )
        if self.broadcast_rpc:
            text += f"\nbroadcast_rpc_address: {self.broadcast_rpc}\n"
        if self.tls:
            from imgest.services.tls import client_encryption_yaml

            text += "\n" + client_encryption_yaml(self.server_tls())
        path = self.home / "cassandra.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # may hold the keystore password
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path

    def runs_with_flags(self) -> bool:
        """Whether the running daemon (if any) was started with this node's JVM_FLAGS (its /proc cmdline)."""
        pid = self.process.pid()
        if pid is None or not self.jvm_flags:
            return True
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return True  # no /proc: nothing to compare against
        return set(self.jvm_flags) <= set(argv)

    def advertised(self) -> str:
        """The broadcast_rpc_address of the config this node was last started with ("": its own address)."""
        conf = self.home / "cassandra.yaml"
        for line in conf.read_text().splitlines() if conf.is_file() else []:
            if line.startswith("broadcast_rpc_address:"):
                return line.split(":", 1)[1].strip()
        return ""

    def token_config(self) -> str:
        """cassandra.yaml lines that place this node's vnodes: the allocator (optimised for TOKEN_RF) or, with
        INITIAL_TOKENS, those tokens and no bootstrap (a node of a new, empty ring: it streams nothing and can
        join while other nodes join)."""
        if not self.initial_tokens:
            return f"allocate_tokens_for_local_replication_factor: {self.token_rf}"
        return f'initial_token: "{",".join(map(str, self.initial_tokens))}"\nauto_bootstrap: false'

    def server_tls(self):  # -> imgest.services.tls.ServerTls
        """This node's CA and keystore under <home>/tls, made on first use."""
        from imgest.services.tls import load_server_tls, make_server_tls

        return load_server_tls(self.home / "tls") or make_server_tls(self.home / "tls", self.host)

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate clients must trust (TLS nodes only)."""
        return self.home / "tls" / "ca.pem" if self.tls else None

    @property
    def client_files(self) -> tuple[Path, Path] | None:
        """The client certificate and key the TLS node requires (mutual TLS), None for other nodes."""
        return (self.home / "tls" / "client.pem", self.home / "tls" / "client-key.pem") if self.tls else None

    def command(self, java: str, lib: Path, config: Path, extra: Sequence[str] = ()) -> list[str]:
        """The JVM command line that runs the daemon in the foreground, EXTRA flags after the options (pure)."""
        jamm = sorted(lib.glob("jamm-*.jar"))
        if not jamm:
            raise ServiceError(f"cassandra: no jamm jar in {lib}; delete that folder to resolve again")
        return [
            java,
            *memory_flags(self.heap),
            *jvm_options(),
            *extra,
            *self.jvm_flags,
            *os.environ.get("IMGEST_CASSANDRA_JAVA_OPTIONS", "").split(),
            f"-javaagent:{jamm[0]}",
            f"-Dcassandra.config={config.as_uri()}",
            f"-Dcassandra.storagedir={self.home / 'data'}",
            f"-Dcassandra.logdir={self.home / 'logs'}",
            # an out-of-memory heap dump (the size of the heap) and a crash report go to this node's logs, not
            # into whatever folder the node was started from
            f"-XX:HeapDumpPath={self.home / 'logs'}",
            f"-XX:ErrorFile={self.home / 'logs' / 'hs_err_pid%p.log'}",
            f"-Dlogback.configurationFile={conf_file('logback.xml').as_uri()}",
            "-Dcassandra-foreground=yes",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            f"-Dcassandra.ring_delay_ms={self.ring_delay_ms}",
            "-Dcassandra.superuser_setup_delay_ms=0",
            *([f"-Dcassandra.jmx.local.port={self.jmx_port}"] if self.jmx_port else []),
            "-cp",
            f"{lib}{os.sep}*",
            DAEMON_CLASS,
        ]

    def answers(self) -> bool:
        """True when a CQL query succeeds (not merely an open port)."""
        if not port_open(self.host, self.native_port):
            return False
        from imgest.core.settings import CassandraSettings
        from imgest.sinks.cassandra.client import cassandra_session

        settings = CassandraSettings(
            hosts=(self.host,),
            port=self.native_port,
            connect_timeout=5,
            username="cassandra" if self.auth else None,
            password="cassandra" if self.auth else None,
            ssl_ca_file=str(self.ca_file) if self.ca_file and self.ca_file.is_file() else None,
            ssl_cert_file=str(self.client_files[0]) if self.client_files else None,
            ssl_key_file=str(self.client_files[1]) if self.client_files else None,
        )
        try:
            with cassandra_session(settings) as session:
                session.execute("SELECT release_version FROM system.local", timeout=5)
            return True
        except Exception as exc:  # any driver error means "not ready yet"
            log.debug("cassandra not answering yet on %s: %s", self.address, exc)
            return False

    def up(self, timeout: float = 180.0) -> UpResult:
        """Start the node unless it already runs; wait until CQL answers."""
        if self.process.pid() is not None and self.answers():
            return UpResult(self.name, False, 0.0, f"{self.name} already running on {self.address}")
        note = self.launch()
        return self.wait_up(timeout, note)

    def launch(self) -> str:
        """Start the JVM unless its process runs (no wait); returns a note on jar resolution for the message."""
        java = which_or_fail(self.name, "java", "install a Java 17 runtime (Debian: openjdk-17-jre-headless)")
        if self.process.pid() is None:
            require_free_port(
                self.name,
                self.host,
                self.native_port,
                "IMGEST_CASSANDRA_AUTH_PORT" if self.auth else "IMGEST_CASSANDRA_PORT",
            )
            require_free_port(
                self.name,
                self.host,
                self.storage_port,
                "IMGEST_CASSANDRA_AUTH_STORAGE_PORT" if self.auth else "IMGEST_CASSANDRA_STORAGE_PORT",
            )
            if self.jmx_port:  # local JMX binds on loopback; a Cassandra of the user's own holds 7199 by default
                ring = self.name.startswith("cassandra-ring")
                env = "IMGEST_CASSANDRA_RING_JMX_PORT" if ring else "IMGEST_CASSANDRA_JMX_PORT"
                require_free_port(self.name, "127.0.0.1", self.jmx_port, env)
        t0 = time.monotonic()
        lib, resolved = resolve_jars()
        resolve_s = time.monotonic() - t0
        if self.process.pid() is None:
            flags, dump = jvmcds.options("cassandra", lib, agent=True)  # class-data archive: a faster start
            jvmcds.writer(dump, self.process.start(self.command(java, lib, self.render_config(), flags)))
        return f" (+{resolve_s:.1f}s resolving jars)" if resolved else ""

    def wait_up(self, timeout: float, note: str = "") -> UpResult:
        """Wait until the launched node answers CQL (fails fast if its process dies)."""
        waited = self.process.wait_ready(self.answers, timeout, f"CQL on {self.address}")
        return UpResult(
            self.name,
            True,
            waited,
            f"{self.name} {cassandra_version()} answers CQL on {self.address} after {waited:.1f}s{note} "
            f"({self.heap >> 20} MiB heap, as much direct memory); logs: {self.home / 'logs'}",
        )

    def down(self) -> bool:
        """Stop the node if imgest started it."""
        return self.process.stop(timeout=60)

    def status(self) -> ServiceStatus:
        return ServiceStatus(
            self.name,
            self.address,
            self.process.pid(),
            self.answers(),
            "PasswordAuthenticator" if self.auth else ("TLS only, CA " + str(self.ca_file) if self.tls else ""),
        )
