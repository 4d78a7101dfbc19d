"""The embedded Airflow's SQLite connection arguments (airflow.cfg's `[database] sql_alchemy_connect_args`)."""

from __future__ import annotations

from typing import Any

# pysqlite waits 5 s for a locked DB; at `airflow standalone`'s start four processes write it at once, and on a
# loaded 2-core machine the scheduler's first write once waited longer and killed it.
CONNECT_ARGS: dict[str, Any] = {"timeout": 60.0}
ASYNC_CONNECT_ARGS: dict[str, Any] = {"timeout": 60.0}  # aiosqlite passes it on to sqlite3; its own dict (Airflow adds
# check_same_thread to the sync one)
