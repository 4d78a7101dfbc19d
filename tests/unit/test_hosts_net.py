"""The simulated hosts' commands and settings as built, without root: namespaces, veths and bridge, the mounts that
give a host its own disk, and what the deployment hands its Airflow processes (imgest.services.hosts_net, hosts)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from imgest.services.hosts import LAYOUT, STATE_URL, SimulatedHosts
from imgest.services.hosts_net import (
    HostView,
    Network,
    SimHost,
    bridge_up_commands,
    down_commands,
    host_up_commands,
    hosts_file,
    in_host,
    mount_script,
)

NET = Network("imgest-hosts", "10.213.0", (SimHost("store", "10.213.0.10"), SimHost("spark-master", "10.213.0.30")))


def test_each_host_gets_a_namespace_a_veth_on_the_bridge_and_no_route_out() -> None:
    cmds = host_up_commands(NET, NET.host("spark-master"))
    assert cmds[0] == ["ip", "netns", "add", "imgest-spark-master"]
    veth = cmds[1][3]
    assert len(veth) <= 15  # Linux's interface name limit
    assert cmds[1] == [
        "ip",
        "link",
        "add",
        veth,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        "imgest-spark-master",
    ]
    assert ["ip", "link", "set", veth, "master", "imgest-hosts"] in cmds
    assert ["ip", "-n", "imgest-spark-master", "addr", "add", "10.213.0.30/24", "dev", "eth0"] in cmds
    assert ["ip", "-n", "imgest-spark-master", "link", "set", "lo", "up"] in cmds
    assert not [c for c in cmds if "route" in c]  # nothing beyond the subnet is reachable
    assert bridge_up_commands(NET)[1] == ["ip", "addr", "add", "10.213.0.1/24", "dev", "imgest-hosts"]


def test_down_deletes_veths_then_namespaces_then_the_bridge() -> None:
    cmds = down_commands(NET)
    kinds = [c[1] for c in cmds]
    assert kinds == ["link", "link", "netns", "netns", "link"]
    assert cmds[-1] == ["ip", "link", "delete", "imgest-hosts"]
    assert {c[3] for c in cmds if c[1] == "netns"} == {"imgest-store", "imgest-spark-master"}


def test_every_host_name_resolves_to_its_address() -> None:
    lines = [ln.split() for ln in hosts_file(NET).splitlines()]
    assert ["10.213.0.10", "store"] in lines
    assert ["10.213.0.30", "spark-master"] in lines
    assert [ln[0] for ln in lines if "store" in ln or "spark-master" in ln] == ["10.213.0.10", "10.213.0.30"]


def _view(state: Path) -> HostView:
    own = state / "hosts" / "store" / "home"
    return HostView(
        state, own, state / "hosts" / "store" / "etc-hosts", ((state / "lib" / "5.0", own / "lib" / "5.0"),)
    )


def test_a_host_sees_its_own_disk_in_place_of_the_state_folder() -> None:
    view = _view(Path("/srv/my state"))
    steps = mount_script("store", view).split(" && ")
    q = shlex.quote
    own, state = q(str(view.own)), q("/srv/my state")
    assert steps[0] == "hostname store"
    assert steps[1] == f"mount --bind {q(str(view.hosts_file))} /etc/hosts"
    ro = f"mount --bind -o ro {q('/srv/my state/lib/5.0')} {q(str(view.own / 'lib' / '5.0'))}"
    # the read-only jars go into its own folder before that folder covers the state folder, then its own folder
    # is also placed at its own path (paths the root machine computed for this host mean the same inside it)
    assert steps[2:5] == [ro, f"mount --rbind {own} {state}", f"mount --rbind {state} {own}"]
    assert steps[5:] == [f"mount --rbind {q(str(view.own / 'tmp'))} /tmp", 'exec "$@"']
    assert view.own / "hosts" / "store" / "home" in view.mountpoints()


def test_what_lies_in_tmp_is_bound_into_the_hosts_tmp_by_its_first_folder_before_it_covers_tmp() -> None:
    """A checkout in /tmp (state folder, code and venv in it), and a venv elsewhere in /tmp: each first folder under
    /tmp once, bound before the host's own tmp covers /tmp; outside /tmp nothing is."""
    state = Path("/tmp/co/.imgest")
    own = state / "hosts" / "store" / "home"
    view = HostView(state, own, state / "hosts" / "store" / "etc-hosts", (), (Path("/tmp/co"), Path("/tmp/env/v")))
    assert view.kept_in_tmp() == [Path("/tmp/co"), Path("/tmp/env")]
    assert {own / "tmp" / "co", own / "tmp" / "env"} <= set(view.mountpoints())
    steps = mount_script("store", view).split(" && ")
    assert steps[-4:] == [
        f"mount --rbind /tmp/co {own / 'tmp' / 'co'}",
        f"mount --rbind /tmp/env {own / 'tmp' / 'env'}",
        f"mount --rbind {own / 'tmp'} /tmp",
        'exec "$@"',
    ]
    assert _view(Path("/srv/state")).kept_in_tmp() == []


def test_a_command_runs_in_the_hosts_namespaces_then_the_mounts() -> None:
    view = _view(Path("/srv/state"))
    cmd = in_host(NET.host("store"), view, ["java", "-version"])
    assert cmd[:4] == ["ip", "netns", "exec", "imgest-store"]
    assert cmd[4:9] == ["unshare", "--uts", "--mount", "--propagation", "private"]
    assert cmd[9:11] == ["sh", "-c"]
    assert cmd[11] == mount_script("store", view)
    assert cmd[12:] == ["sh", "java", "-version"]


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedHosts:
    """A deployment (never started) whose state folder is TMP_PATH, with a caller's environment that names the
    loopback stores and the test suite's reused Spark driver."""
    monkeypatch.setenv("IMGEST_CASSANDRA_HOSTS", "127.0.0.1")
    monkeypatch.setenv("IMGEST_S3_ENDPOINT", "http://127.0.0.1:8333")
    monkeypatch.setenv("IMGEST_SPARK_DRIVER_SOCKET", str(tmp_path / "driver.sock"))
    return SimulatedHosts(state=tmp_path)


def test_airflow_hosts_get_the_stores_only_as_connections(deployment: SimulatedHosts) -> None:
    store, master = deployment.address("store"), deployment.address("spark-master")
    for host in ("control", "worker-a", "worker-b"):
        env = deployment.env(host)
        assert not [k for k, v in env.items() if "127.0.0.1" in v or "localhost" in v], env
        assert not {"IMGEST_SPARK_DRIVER_SOCKET", "IMGEST_CASSANDRA_HOSTS", "IMGEST_S3_ENDPOINT"} & set(env)
        assert json.loads(env["AIRFLOW_CONN_CASSANDRA_DEFAULT"])["host"] == store
        aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
        assert aws["extra"] == {"endpoint_url": f"http://{store}:5050", "region_name": "eu-west-1"}
        assert "login" not in aws  # no key: the host's web identity signs
        assert env["AWS_ROLE_ARN"] == f"arn:aws:iam::123456789012:role/imgest-host-{host}"
        assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == str(deployment.state / "irsa" / "token")
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env)
        spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert f"{spark['host']}:{spark['port']}" == f"spark://{master}:7077"
        assert env["IMGEST_STATE_URL"] == STATE_URL
        assert env["IMGEST_HOME"] == str(deployment.state)
    assert deployment.env("worker-a")["SPARK_LOCAL_IP"] == deployment.address("worker-a")  # the driver's address
    assert "AIRFLOW_CONN_AWS_DEFAULT" not in deployment.env("spark-1")
    assert deployment.env("spark-1")["AWS_ROLE_ARN"].endswith(":role/imgest-host-spark-1")  # executors' own
    assert "AWS_ROLE_ARN" not in deployment.env("store")


def test_every_airflow_host_shares_one_config_naming_the_control_and_store_hosts(deployment: SimulatedHosts) -> None:
    control, store = deployment.address("control"), deployment.address("store")
    texts = set()
    for host in ("control", "worker-a", "worker-b"):
        airflow = deployment.airflow(host)
        text = airflow.write_config().read_text()
        texts.add(text.replace(str(airflow.home), "<home>"))
    assert len(texts) == 1  # one deployment: the same secrets, database and broker everywhere
    text = texts.pop()
    assert f"execution_api_server_url = http://{control}:8080/execution/" in text
    assert f"@{store}:5432/airflow" in text
    assert "redis://:" in text
    assert f"@{store}:6379/0" in text
    assert "127.0.0.1" not in text


def test_the_layout_gives_every_host_its_own_address(deployment: SimulatedHosts) -> None:
    addresses = [deployment.address(name) for name, _, _ in LAYOUT]
    assert len(set(addresses)) == len(LAYOUT) == 7
    assert all(a.startswith("10.213.0.") and a != deployment.network.gateway for a in addresses)
