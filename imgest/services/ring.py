"""A local three-node Cassandra ring: the embedded node's class, one loopback address per node.

Nodes listen on 127.0.0.2, 127.0.0.3 and 127.0.0.4 (``IMGEST_CASSANDRA_RING_HOSTS``) with the same ports
(9042 CQL, 7000 storage), so the single embedded node on 127.0.0.1 and the ring never compete for a port
and a client left on the default 127.0.0.1 never writes to the ring by mistake. Each node has its own
data and log folders under ``<state>/cassandra-ring/nodeN``, a 1 GiB heap, the first node as seed, and a
local-only JMX port (7201, 7202, 7203) for ``nodetool``. The ring is made for tests and local trials, so it
starts new and empty: every node gets fixed, interleaved tokens (``ring_tokens``) and joins without bootstrap
(nothing to stream). The seed starts first; the other nodes then start together, since none of them waits on
another's bootstrap (the allocator's one-node-at-a-time joins took a minute of the test suite).

Every node allows ``NODE_LOCAL`` reads (``-Dcassandra.enable_nodelocal_queries=true``): the node that receives such
a query answers from its own data, asking no replica and repairing nothing, so that a check reads each replica
alone (:func:`imgest.sinks.cassandra.replicas.node_local_rows`). That is a ring for tests and local trials; a
production cluster leaves it off.

``IMGEST_CASSANDRA_RING_ADVERTISE`` (one address per node) makes each node tell clients another address than its
own (``broadcast_rpc_address``): a proxy in front of it, so that a driver which discovers the ring's nodes from
``system.peers`` connects to every node through that proxy (``imgest bench plugin --parts ring``).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from imgest.core import jvmcds
from imgest.core.errors import ServiceError
from imgest.core.paths import conf_file, state_dir
from imgest.core.settings import env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.cassandra import CassandraServer, jars_dir, jvm_options, resolve_jars
from imgest.services.process import stop_all, which_or_fail

log = logging.getLogger(__name__)
RING_HOSTS = "127.0.0.2,127.0.0.3,127.0.0.4"
NODETOOL_CLASS = "org.apache.cassandra.tools.NodeTool"
STATUS_LINE = re.compile(r"^([UD][NLJM])\s+(\d+\.\d+\.\d+\.\d+)")
VNODES = 16  # num_tokens of cassandra.yaml
MIN_TOKEN, TOKEN_SPACE = -(2**63), 2**64  # Murmur3Partitioner
NODE_LOCAL_QUERIES = "-Dcassandra.enable_nodelocal_queries=true"  # each replica read alone (the module's note)


def ring_tokens(nodes: int, vnodes: int = VNODES) -> list[tuple[int, ...]]:
    """Each node's VNODES tokens, spread evenly and interleaved around the Murmur3 ring (node i owns every
    NODES-th of NODES * VNODES equal slices): balanced ownership without the token allocator."""
    slices = nodes * vnodes
    return [tuple(MIN_TOKEN + (v * nodes + i) * TOKEN_SPACE // slices for v in range(vnodes)) for i in range(nodes)]


def tool_jvm_options() -> list[str]:
    """JVM flags nodetool needs on Java 17 (the server's module exports/opens), logging to stderr only and C1
    only (a client that lives a few seconds: C2's compiler threads would cost more CPU than they ever save).

    The server's logback.xml writes to ${cassandra.logdir}; a tool run with it and no logdir would create a
    folder named ``cassandra.logdir_IS_UNDEFINED`` in the current directory.
    """
    opens = [flag for flag in jvm_options() if flag.startswith("--add-")]
    return [
        *opens,
        f"-Dlogback.configurationFile={conf_file('logback-tools.xml').as_uri()}",
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",
    ]


@dataclass(frozen=True)
class CassandraRing:
    """Three (or more) CassandraServer nodes forming one cluster, started and stopped together."""

    nodes: tuple[CassandraServer, ...]
    name: str = "cassandra-ring"
    join_seconds: dict[str, float] = field(default_factory=dict, compare=False)

    @classmethod
    def default(cls) -> CassandraRing:
        """The ring on IMGEST_CASSANDRA_RING_HOSTS (default 127.0.0.2-4), ports 9042 / 7000."""
        hosts = [h.strip() for h in os.environ.get("IMGEST_CASSANDRA_RING_HOSTS", RING_HOSTS).split(",") if h.strip()]
        native = env_int("IMGEST_CASSANDRA_RING_PORT", 9042)
        storage = env_int("IMGEST_CASSANDRA_RING_STORAGE_PORT", 7000)
        jmx = env_int("IMGEST_CASSANDRA_RING_JMX_PORT", 7200)
        tokens = ring_tokens(len(hosts))
        advertise = [h.strip() for h in os.environ.get("IMGEST_CASSANDRA_RING_ADVERTISE", "").split(",") if h.strip()]
        if advertise and len(advertise) != len(hosts):
            raise ServiceError(
                f"IMGEST_CASSANDRA_RING_ADVERTISE names {len(advertise)} addresses for {len(hosts)} ring nodes"
            )
        nodes = tuple(
            CassandraServer(
                home=state_dir() / "cassandra-ring" / f"node{i}",
                native_port=native,
                storage_port=storage,
                host=host,
                name=f"cassandra-ring-{i}",
                seeds=f"{hosts[0]}:{storage}",
                cluster="imgest-ring",
                jmx_port=jmx + i,
                token_rf=min(3, len(hosts)),
                initial_tokens=tokens[i - 1],
                ring_delay_ms=10_000,  # 1 s (the single node's) is too short to reach the seed from a busy box
                broadcast_rpc=advertise[i - 1] if advertise else "",
                jvm_flags=(NODE_LOCAL_QUERIES,),
            )
            for i, host in enumerate(hosts, start=1)
        )
        return cls(nodes)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Contact points of every node."""
        return tuple(n.host for n in self.nodes)

    def answers(self) -> bool:
        """True when every node answers CQL."""
        return all(n.answers() for n in self.nodes)

    def up(self, timeout: float = 300.0) -> UpResult:
        """Start the seed, then the other nodes together; each Up/Normal in the ring before this returns."""
        t0 = time.monotonic()
        started = False
        seed, others = self.nodes[0], self.nodes[1:]
        stale = [
            n
            for n in self.nodes
            if n.process.pid() is not None and (n.advertised() != n.broadcast_rpc or not n.runs_with_flags())
        ]
        if stale:  # another client address (IMGEST_CASSANDRA_RING_ADVERTISE changed) or other flags: restart them
            log.info("restarting %s: their client address or JVM flags changed", ", ".join(n.name for n in stale))
            stop_all([n.process for n in stale], timeout=60)
        try:
            result = seed.up(timeout)
            started = result.started
            self.wait_joined(seed, timeout)
            self.join_seconds[seed.host] = round(time.monotonic() - t0, 1)
            t_rest = time.monotonic()
            waiting = [n for n in others if n.process.pid() is None or not n.answers()]
            for node in waiting:
                node.launch()
            started = started or bool(waiting)
            for node in others:
                if node in waiting:
                    node.wait_up(max(1.0, timeout - (time.monotonic() - t_rest)))
                self.wait_joined(node, max(1.0, timeout - (time.monotonic() - t_rest)))
                self.join_seconds[node.host] = round(time.monotonic() - t_rest, 1)
            self.wait_agreed(max(1.0, timeout - (time.monotonic() - t0)))
        except BaseException:
            if started or any(n.process.pid() is not None for n in self.nodes):
                self.down()  # leave nothing half-started behind
            raise
        for host, seconds in self.join_seconds.items():
            log.info("%s joined after %.1fs", host, seconds)
        total = time.monotonic() - t0
        per_node = ", ".join(f"{h} {s:.0f}s" for h, s in self.join_seconds.items())
        return UpResult(
            self.name,
            started,
            total,
            f"{self.name}: {len(self.nodes)} nodes up and joined after {total:.1f}s ({per_node}); "
            f"CQL on {','.join(self.hosts)}:{self.nodes[0].native_port}; logs: {self.nodes[0].home.parent}/node*/logs",
        )

    def wait_joined(self, node: CassandraServer, timeout: float) -> None:
        """Wait until NODE is Up/Normal as the first node sees it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ring_state().get(node.host) == "UN":
                return
            time.sleep(2)
        raise ServiceError(f"{node.name} on {node.host} did not join the ring in {timeout:.0f}s; read {node.home}/logs")

    def wait_agreed(self, timeout: float) -> None:
        """Wait until every node sees every node Up/Normal. Nodes that join together learn of each other by gossip,
        seconds apart: until then a node that has not seen a peer's tokens stores the peer's rows itself, and a read
        that asks the owner misses them (seen in CI with replication 1)."""
        deadline = time.monotonic() + timeout
        views: dict[str, dict[str, str]] = {}
        while time.monotonic() < deadline:
            views = {n.host: self.ring_state(node=i) for i, n in enumerate(self.nodes)}
            if all(all(view.get(h) == "UN" for h in self.hosts) for view in views.values()):
                return
            time.sleep(2)
        raise ServiceError(f"the nodes do not agree on the ring after {timeout:.0f}s: {views}")

    def down(self) -> bool:
        """Stop every node imgest started, all at once (each drains while the others do)."""
        return any(stop_all([node.process for node in self.nodes], timeout=60))

    def kill(self, index: int) -> int | None:
        """SIGKILL node INDEX (0-based), as a crash would; returns the PID killed."""
        import signal

        pid = self.nodes[index].process.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.nodes[index].process.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.2)
        return pid

    def nodetool(self, *args: str, node: int | None = None, timeout: float = 600) -> str:
        """Output of `nodetool ARGS` against NODE (default: the first node whose JMX answers)."""
        java = which_or_fail(self.name, "java", "install a Java 17 runtime (Debian: openjdk-17-jre-headless)")
        lib = jars_dir() if (jars_dir() / ".resolved").is_file() else resolve_jars()[0]
        candidates = [self.nodes[node]] if node is not None else [n for n in self.nodes if n.process.pid()]
        errors = []
        for target in candidates:
            flags, dump = jvmcds.options("nodetool", lib)
            cmd = [java, *tool_jvm_options(), *flags, "-cp", f"{lib}{os.sep}*", NODETOOL_CLASS]
            cmd += ["-h", "127.0.0.1", "-p", str(target.jmx_port), *args]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
                jvmcds.writer(dump, proc.pid)
                try:
                    out, err = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise
            if proc.returncode == 0:
                return out
            errors.append(f"{target.name}: {(err or out).strip().splitlines()[-1:]}")
        raise ServiceError(f"nodetool {' '.join(args)} failed: {'; '.join(errors) or 'no node running'}")

    def ring_state(self, node: int | None = None) -> dict[str, str]:
        """address -> state (UN, DN, UJ, ...) as `nodetool status` on NODE (default: a live node) reports it; {} if
        none answers."""
        try:
            out = self.nodetool("status", node=node, timeout=60)
        except (ServiceError, subprocess.TimeoutExpired):
            return {}
        states = {}
        for line in out.splitlines():
            match = STATUS_LINE.match(line.strip())
            if match:
                states[match.group(2)] = match.group(1)
        return states

    def status(self) -> ServiceStatus:
        """One line: every node's state as the ring sees it."""
        states = self.ring_state()
        detail = " ".join(
            f"{n.host}={states.get(n.host, 'down' if n.process.pid() is None else '?')}" for n in self.nodes
        )
        pids = [n.process.pid() for n in self.nodes]
        live = [p for p in pids if p]
        return ServiceStatus(
            self.name,
            f"{','.join(self.hosts)}:{self.nodes[0].native_port}",
            live[0] if live else None,
            bool(states) and all(states.get(h) == "UN" for h in self.hosts),
            f"ring: {detail}; pids {','.join(str(p or '-') for p in pids)}",
        )

    def home(self) -> Path:
        """The folder holding every node's folder."""
        return self.nodes[0].home.parent
