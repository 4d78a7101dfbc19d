"""Simulated hosts on one Linux machine: a network namespace per host, a veth pair from each onto one bridge, and
the command that runs a program inside a host with its own host name, /etc/hosts and disk.

The functions that build commands are pure (they return argv lists or shell text) and are unit-tested without
root; ``run_all`` and the probes below them touch the machine (root: ``ip``, ``mount``, ``unshare``).

What a host sees of the file system (``HostView``): the whole machine except the state folder (``$IMGEST_HOME``),
in whose place its own folder appears, at the state folder's path and at its own path, so a path the root machine
computed for that host (``<state>/hosts/<name>/home/...``) means the same file inside it; ``/tmp`` is its own too.
Read-only binds (the Cassandra jars, like an installed package) are placed into its own folder first. The code
and the virtual environment stay visible, as an installed image would be.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ServiceError

log = logging.getLogger(__name__)

NETNS_PREFIX = "imgest-"
IFNAME_MAX = 15  # Linux interface names: at most 15 bytes
INNER_IF = "eth0"


@dataclass(frozen=True)
class SimHost:
    """One simulated host: its NAME (also its host name) and its ADDRESS on the bridge's subnet."""

    name: str
    address: str

    @property
    def netns(self) -> str:
        """Its network namespace (``ip netns``)."""
        return NETNS_PREFIX + self.name

    @property
    def veth(self) -> str:
        """The root-side end of its veth pair (on the bridge)."""
        return ("ih-" + self.name)[:IFNAME_MAX]


@dataclass(frozen=True)
class Network:
    """The bridge and the hosts on it: every host in SUBNET (a /24 given as its first three octets)."""

    bridge: str
    subnet: str
    hosts: tuple[SimHost, ...]
    gateway_octet: int = 1  # the bridge's own address in the root namespace (a person's browser reaches the UI)

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.{self.gateway_octet}"

    def host(self, name: str) -> SimHost:
        """The host called NAME (ServiceError naming the known ones otherwise)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise ServiceError(f"hosts: no host {name!r}; the hosts are {', '.join(h.name for h in self.hosts)}")


def bridge_up_commands(net: Network) -> list[list[str]]:
    """Create the bridge with the gateway address in the root namespace (no route or NAT beyond it)."""
    return [
        ["ip", "link", "add", net.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{net.gateway}/24", "dev", net.bridge],
        ["ip", "link", "set", net.bridge, "up"],
    ]


def host_up_commands(net: Network, host: SimHost) -> list[list[str]]:
    """Create HOST's namespace and its veth pair: eth0 inside with its address, the other end on the bridge, lo up.
    No default route: nothing beyond the subnet is reachable from the host."""
    ns = host.netns
    return [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host.veth, "type", "veth", "peer", "name", INNER_IF, "netns", ns],
        ["ip", "link", "set", host.veth, "master", net.bridge],
        ["ip", "link", "set", host.veth, "up"],
        ["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", INNER_IF],
        ["ip", "-n", ns, "link", "set", INNER_IF, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ]


def down_commands(net: Network) -> list[list[str]]:
    """Delete every veth pair (both ends go), every namespace, then the bridge."""
    cmds = [["ip", "link", "delete", h.veth] for h in net.hosts]
    cmds += [["ip", "netns", "delete", h.netns] for h in net.hosts]
    return [*cmds, ["ip", "link", "delete", net.bridge]]


def hosts_file(net: Network) -> str:
    """/etc/hosts of every host: localhost, then each host's address and name."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in net.hosts]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class HostView:
    """What a host's processes see: STATE (the root machine's state folder) replaced by OWN (the host's folder),
    OWN also at its own path, /etc/hosts from HOSTS_FILE, /tmp from OWN/tmp and each (source, target) of READ_ONLY
    (TARGET inside OWN) bound read-only. What lies in /tmp and must stay visible (the state folder, and VISIBLE: the
    checkout and the Python environment the hosts run, when a checkout lies in /tmp) is bound into OWN/tmp at its
    place, by its first folder under /tmp, before OWN/tmp covers /tmp: the host sees them, and no other host's /tmp."""

    state: Path
    own: Path
    hosts_file: Path
    read_only: tuple[tuple[Path, Path], ...] = ()
    visible: tuple[Path, ...] = ()

    @property
    def tmp(self) -> Path:
        return self.own / "tmp"

    def kept_in_tmp(self) -> list[Path]:
        """The first folders under /tmp of the state folder and of VISIBLE (those that lie in /tmp), each once."""
        tops = [Path("/tmp") / p.relative_to("/tmp").parts[0] for p in (self.state, *self.visible) if in_tmp(p)]
        return list(dict.fromkeys(tops))

    def mountpoints(self) -> list[Path]:
        """Folders (root view) that must exist before the mounts: OWN's copy of its own path, the tmp folder, the
        places in it of what stays visible, and the read-only targets."""
        mirror = self.own / self.own.relative_to(self.state)
        kept = [self.tmp / top.name for top in self.kept_in_tmp()]
        return [mirror, self.tmp, *kept, *(target for _, target in self.read_only)]


def in_tmp(path: Path) -> bool:
    """Whether PATH lies inside /tmp (not /tmp itself)."""
    return path.is_relative_to("/tmp") and path != Path("/tmp")


def mount_script(hostname: str, view: HostView) -> str:
    """Shell (run in a fresh UTS and mount namespace) that sets the host name and the mounts of VIEW, then execs
    its arguments."""
    q = shlex.quote
    state, own = q(str(view.state)), q(str(view.own))
    steps = [f"hostname {q(hostname)}", f"mount --bind {q(str(view.hosts_file))} /etc/hosts"]
    steps += [f"mount --bind -o ro {q(str(src))} {q(str(dst))}" for src, dst in view.read_only]
    steps += [f"mount --rbind {own} {state}", f"mount --rbind {state} {own}"]
    # what stays visible in /tmp, as this host sees it now (its own folder in place of the state folder)
    steps += [f"mount --rbind {q(str(top))} {q(str(view.tmp / top.name))}" for top in view.kept_in_tmp()]
    steps.append(f"mount --rbind {q(str(view.tmp))} /tmp")
    return " && ".join([*steps, 'exec "$@"'])


def in_host(host: SimHost, view: HostView, argv: Sequence[str] = ()) -> list[str]:
    """ARGV run inside HOST: its network namespace, then its own host name and file system view (pure). With no
    ARGV, the prefix to put before a command."""
    namespaces = ["unshare", "--uts", "--mount", "--propagation", "private"]
    return ["ip", "netns", "exec", host.netns, *namespaces, "sh", "-c", mount_script(host.name, view), "sh", *argv]


def prepare_view(net: Network, view: HostView) -> None:
    """Create VIEW's folders and write its /etc/hosts (root side, before any process starts in it)."""
    view.own.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in view.mountpoints():
        folder.mkdir(parents=True, exist_ok=True)
    view.tmp.chmod(0o1777)  # as /tmp: the postgres user makes its mount point there
    view.hosts_file.parent.mkdir(parents=True, exist_ok=True)
    view.hosts_file.write_text(hosts_file(net))


def run_all(cmds: Iterable[Sequence[str]], check: bool = True) -> list[str]:
    """Run each command; with CHECK a failure raises ServiceError naming it, otherwise its error is returned."""
    errors = []
    for cmd in cmds:
        done = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            error = f"{shlex.join(cmd)}: {(done.stderr or done.stdout).strip()}"
            if check:
                raise ServiceError(f"hosts: {error}")
            errors.append(error)
    return errors


def existing_netns() -> set[str]:
    """Names of the network namespaces `ip netns` lists."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    """Whether the root namespace has a network interface NAME."""
    return Path("/sys/class/net", name).exists()


def net_up(net: Network) -> None:
    """Create the bridge and every host's namespace and veth (what exists already is kept)."""
    if not link_exists(net.bridge):
        run_all(bridge_up_commands(net))
    have = existing_netns()
    for host in net.hosts:
        if host.netns not in have:
            run_all(host_up_commands(net, host))


def net_down(net: Network) -> bool:
    """Delete the namespaces, veths and bridge of NET (each only if it exists); True if any existed."""
    existed = False
    for cmd in down_commands(net):
        if _present(cmd):
            existed = True
            for error in run_all([cmd], check=False):
                log.warning("hosts: %s", error)
    return existed


def _present(cmd: Sequence[str]) -> bool:
    if cmd[:3] == ["ip", "netns", "delete"]:
        return cmd[3] in existing_netns()
    return link_exists(cmd[-1])
