"""`imgest locks`: which store, who holds what, which holders are stale; `release` frees one."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.cli import main
from imgest.core import locks


def test_locks_lists_holders_with_their_store_and_staleness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    monkeypatch.delenv("IMGEST_STATE_URL", raising=False)
    assert locks.try_acquire("alive", locks.cli_holder("imgest ingest shards")) is None
    expired = locks.Holder("airflow", "Airflow DAG ingest_imagenet run gone", since="then", lease_s=0.01)
    assert locks.try_acquire("expired", expired) is None
    __import__("time").sleep(0.05)
    assert main(["locks"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"lock store {tmp_path.resolve() / 'locks'}: 2 held"
    rows = {line.split()[0]: line for line in out[1:]}
    assert "imgest ingest shards" in rows["alive"]
    assert "stale" not in rows["alive"]
    assert "[stale: lease of 0s not renewed for " in rows["expired"]
    assert main(["locks", "release", "expired"]) == 0
    assert "expired: released" in capsys.readouterr().out
    assert set(locks.held()) == {"alive"}
