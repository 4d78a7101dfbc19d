"""OwnerRouter.host: a connection opened a moment ago may not list every node yet; the router asks its metadata
again for a node it lacked instead of sending that node's requests anywhere for the rest of the read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imgest.readback.cassandra_owners import OwnerRouter


@dataclass
class _Host:
    endpoint: str


@dataclass
class _Metadata:
    hosts: list[_Host] = field(default_factory=list)

    def all_hosts(self) -> list[_Host]:
        return list(self.hosts)


@dataclass
class _Cluster:
    metadata: _Metadata


def test_a_node_the_connection_did_not_list_yet_is_looked_up_again() -> None:
    nodes = ["10.0.0.1:9042", "10.0.0.2:9042"]
    router = OwnerRouter(token_map=None, keyspace="ks", nodes=nodes, size=4)
    first = _Host(nodes[0])
    cluster: Any = _Cluster(_Metadata([first]))  # the second node not known to this connection yet
    assert router.host(cluster, 0) is first
    assert router.host(cluster, 1) is None  # not known: the request goes where the driver sends it
    second = _Host(nodes[1])
    cluster.metadata.hosts.append(second)
    assert router.host(cluster, 1) is second  # known now: its requests go to it (was: None for good)
    assert router.host(cluster, -2) is None  # an id whose owner is unknown goes anywhere
