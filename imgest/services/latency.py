"""A real TCP latency proxy (Toxiproxy) between readers and Cassandra or S3, on loopback.

``toxiproxy-server`` is built by the project's test install from the Go module proxy into
``<state>/bin/``. ``LatencyProxy`` starts it, opens one proxy per upstream (listen port -> upstream port) and
sets an added round trip: half of it as latency on each direction, so a request/response pays the full RTT,
optionally with jitter (each chunk's delay drawn in latency +- jitter) and a bandwidth limit on the responses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.core.errors import ServiceError
from imgest.core.paths import state_dir
from imgest.core.settings import EMBEDDED_HOST, env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.process import ManagedProcess, port_open, require_free_port

log = logging.getLogger(__name__)
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0"


def toxiproxy_binary() -> Path:
    """The toxiproxy-server built by `make install-dev` (scripts/install.sh)."""
    path = state_dir() / "bin" / "toxiproxy-server"
    if not path.is_file():
        raise ServiceError(
            f"latency proxy: {path} is missing; run `make install-dev` (it builds {TOXIPROXY_MODULE} with Go)"
        )
    return path


API_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LatencyProxy:
    """toxiproxy-server on API_PORT with proxies added on demand."""

    home: Path
    api_port: int = 8474
    host: str = EMBEDDED_HOST
    name: str = "latency-proxy"

    @classmethod
    def default(cls) -> LatencyProxy:
        return cls(home=state_dir() / "latency-proxy", api_port=env_int("IMGEST_LATENCY_PROXY_PORT", 8474))

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "toxiproxy.pid", self.home / "toxiproxy.log")

    @property
    def api(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = API_TIMEOUT_S) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.api + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            # 60 s: toxiproxy applies a toxic change to every open link first, which took over 10 s once on two
            # busy cores (the suite's two workers); a call that still does not answer is an error naming it.
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            raise ServiceError(f"latency proxy {method} {path}: HTTP {exc.code} {exc.read()[:200]!r}") from None
        except TimeoutError:
            raise ServiceError(f"latency proxy {method} {path}: no answer from {self.api} in {timeout:.0f} s") from None
        return json.loads(text) if text else None

    def answers(self) -> bool:
        if not port_open(self.host, self.api_port):
            return False
        try:
            self._call("GET", "/proxies", timeout=10)
            return True
        except (ServiceError, OSError):
            return False

    def up(self, timeout: float = 30.0) -> UpResult:
        """Start toxiproxy-server unless it runs; wait for its API."""
        if self.process.pid() is not None and self.answers():
            return UpResult(self.name, False, 0.0, f"latency proxy already running on {self.api}")
        if self.process.pid() is None:
            require_free_port(self.name, self.host, self.api_port, "IMGEST_LATENCY_PROXY_PORT")
            self.home.mkdir(parents=True, exist_ok=True)
            argv = [str(toxiproxy_binary()), "-host", self.host, "-port", str(self.api_port)]
            self.process.start(argv, cwd=self.home)
        waited = self.process.wait_ready(self.answers, timeout, f"latency proxy on {self.api}")
        return UpResult(self.name, True, waited, f"latency proxy (toxiproxy) answers on {self.api} after {waited:.1f}s")

    def down(self) -> bool:
        return self.process.stop()

    def status(self) -> ServiceStatus:
        return ServiceStatus(self.name, self.api, self.process.pid(), self.answers())

    def proxy(self, name: str, listen_port: int, upstream: str, listen_host: str = "") -> str:
        """(Re)create proxy NAME listening on LISTEN_HOST (default: this proxy's host):LISTEN_PORT and forwarding
        to UPSTREAM (host:port); its address."""
        with contextlib.suppress(ServiceError):  # not there yet
            self._call("DELETE", f"/proxies/{name}")
        listen = f"{listen_host or self.host}:{listen_port}"
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        return listen

    def _toxic(self, name: str, toxic: str, body: dict[str, Any] | None) -> None:
        """Replace TOXIC of proxy NAME by BODY (None: remove it)."""
        with contextlib.suppress(ServiceError):  # not set yet
            self._call("DELETE", f"/proxies/{name}/toxics/{toxic}")
        if body is not None:
            self._call("POST", f"/proxies/{name}/toxics", {"name": toxic, **body})

    def set_rtt(self, name: str, rtt_ms: float, jitter_ms: float = 0.0) -> None:
        """Add RTT_MS (+- JITTER_MS) to every round trip through proxy NAME (0 removes the delay)."""
        for direction in ("upstream", "downstream"):
            attributes = {"latency": round(rtt_ms / 2), "jitter": round(jitter_ms / 2)}
            body = {"type": "latency", "stream": direction, "attributes": attributes}
            self._toxic(name, f"delay_{direction}", body if rtt_ms > 0 else None)

    def set_bandwidth(self, name: str, rate_kb_s: int) -> None:
        """Limit what proxy NAME sends back to the client to RATE_KB_S kilobytes per second (0 removes the limit)."""
        body = {"type": "bandwidth", "stream": "downstream", "attributes": {"rate": rate_kb_s}}
        self._toxic(name, "bandwidth_downstream", body if rate_kb_s > 0 else None)

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Cut (False) or restore (True) every connection through proxy NAME: a server that went away."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})
