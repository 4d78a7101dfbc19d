"""A simulated host's file system view, mounted for real (a mount namespace, as the hosts harness makes one): its
own folder in place of the state folder and its own /tmp, also when the state folder (the checkout) lies in /tmp,
where covering /tmp used to hide the host's own folder (and was therefore left off, so hosts shared /tmp)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imgest.services.hosts_net import HostView, Network, SimHost, mount_script, prepare_view

NET = Network("imgest-view", "10.213.9", (SimHost("store", "10.213.9.10"),))


@pytest.fixture
def in_tmp() -> Iterator[Path]:
    """A state folder in /tmp (in a checkout under /tmp, as .imgest/ in it), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a mount namespace needs root and unshare (util-linux)")
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="imgest-view-"))
    try:
        yield root / "co" / ".imgest"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_state_folder_in_tmp_stays_the_hosts_own_and_tmp_is_its_own(in_tmp: Path) -> None:
    state = in_tmp
    own = state / "hosts" / "store" / "home"
    own.mkdir(parents=True)
    (state / "on-the-root-machine").write_text("root")
    (own / "on-the-host").write_text("host\n")
    checkout = state.parent
    (checkout / "code.py").write_text("code\n")  # the checkout the host runs, beside the state folder
    token = secrets.token_hex(4)
    outside = Path("/tmp") / f"imgest-view-root-only-{token}"
    outside.write_text("root's /tmp")
    view = HostView(state, own, state / "hosts" / "store" / "etc-hosts", (), (checkout,))
    prepare_view(NET, view)
    probe = " ; ".join(
        [
            f"cat {state}/on-the-host",  # the state folder shows the host's own folder
            f"test -e {state}/on-the-root-machine && echo root-state-visible || echo root-state-hidden",
            f"cat {own}/on-the-host",  # its own folder at its own path too
            f"cat {checkout}/code.py",  # the checkout, also in /tmp, stays visible
            f"test -e {outside} && echo root-tmp-visible || echo root-tmp-hidden",
            f"echo written > /tmp/by-the-host-{token}",
            "hostname",
        ]
    )
    namespace = ["unshare", "--uts", "--mount", "--propagation", "private"]
    try:
        run = subprocess.run(
            [*namespace, "sh", "-c", mount_script("store", view), "sh", "sh", "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        outside.unlink()
    assert run.returncode == 0, run.stderr
    expected = ["host", "root-state-hidden", "host", "code", "root-tmp-hidden", "store"]
    assert run.stdout.split() == expected, run.stderr
    assert (own / "tmp" / f"by-the-host-{token}").read_text() == "written\n"  # the host's /tmp is its own folder's
    assert not Path(f"/tmp/by-the-host-{token}").exists()
