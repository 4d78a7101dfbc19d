"""What every embedded service reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ServiceStatus:
    """One line of `imgest services status`."""

    name: str
    address: str
    pid: int | None
    answers: bool
    detail: str = ""

    def line(self) -> str:
        """Human-readable one-liner."""
        state = "up" if self.answers else ("starting/unresponsive" if self.pid else "down")
        owner = f"pid {self.pid}" if self.pid else ("not started by imgest" if self.answers else "-")
        extra = f"  {self.detail}" if self.detail else ""
        return f"{self.name:<10} {state:<22} {self.address:<28} {owner}{extra}"


@dataclass(frozen=True)
class UpResult:
    """What `up` did: whether it started the service and how long it took to answer."""

    name: str
    started: bool
    seconds: float
    message: str


class Service(Protocol):
    """An embedded service imgest can start, stop and query."""

    name: str

    def up(self) -> UpResult: ...

    def down(self) -> bool: ...

    def status(self) -> ServiceStatus: ...

    def answers(self) -> bool: ...
