"""Requests sent to the node that holds their rows.

The reader asks for many rows per request (``id IN ?``). On a cluster of several nodes a request's ids belong
to different nodes, and its coordinator fetches the rows it does not hold from the others: an extra hop and
the server CPU of copying every image twice. ``OwnerRouter`` groups a request's ids by the node that owns them
(the first replica of their token, from the driver's token map) and names the node each group goes to, as a
token-aware driver does for single-row requests. On one node (or without a token map) the reader does not use
it: every request goes out as before.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class OwnerRouter:
    """The owner (an index into ``nodes``) of each id position, computed once per position, and each
    connection's driver Host for each owner."""

    def __init__(self, token_map: Any, keyspace: str, nodes: list[str], size: int) -> None:
        self._token_map, self._keyspace = token_map, keyspace
        self.nodes = nodes  # endpoint text ("address:port") of every node, sorted
        self._index = {node: k for k, node in enumerate(nodes)}
        self._owner = np.full(size, -1, dtype=np.int16)  # -1: not looked up yet
        self._hosts: dict[int, list[Any]] = {}  # id(cluster) -> its Host per owner (None where it has none)

    @classmethod
    def for_cluster(cls, cluster: Any, table: str, size: int) -> OwnerRouter | None:
        """A router for CLUSTER (a connected driver Cluster with token metadata) reading TABLE's SIZE ids; None
        when the cluster has one node or its token map is unknown."""
        token_map = getattr(cluster.metadata, "token_map", None)
        nodes = sorted(str(h.endpoint) for h in cluster.metadata.all_hosts())
        if token_map is None or len(nodes) < 2 or "." not in table:
            return None
        return cls(token_map, table.split(".", 1)[0], nodes, size)

    def owner(self, position: int, key: str) -> int:
        """The owner of the id KEY at POSITION (-2: no replica known, the request goes anywhere)."""
        k = int(self._owner[position])
        if k == -1:
            token = self._token_map.token_class.from_key(uuid.UUID(key).bytes)
            replicas = self._token_map.get_replicas(self._keyspace, token)
            k = self._index.get(str(replicas[0].endpoint), -2) if replicas else -2
            self._owner[position] = k
        return k

    def split(self, positions: np.ndarray, id_at: Callable[[int], str]) -> list[tuple[int, list[int]]]:
        """POSITIONS grouped by owner: (owner, positions in their order) per owner, owners in order of first
        appearance."""
        groups: dict[int, list[int]] = {}
        for p in positions.tolist():
            groups.setdefault(self.owner(p, id_at(p)), []).append(p)
        return list(groups.items())

    def host(self, cluster: Any, owner: int) -> Any:
        """CLUSTER's Host for OWNER (None: let the driver choose)."""
        if owner < 0:
            return None
        hosts = self._hosts.get(id(cluster))
        if hosts is None or hosts[owner] is None:  # a connection just opened may not list every node yet: ask again
            by_endpoint = {str(h.endpoint): h for h in cluster.metadata.all_hosts()}
            hosts = self._hosts[id(cluster)] = [by_endpoint.get(node) for node in self.nodes]
        return hosts[owner]
