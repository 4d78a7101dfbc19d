"""Queries of an Airflow deployment's PostgreSQL metadata database (the tests of the Celery and hosts deployments)."""

from __future__ import annotations

from typing import Any

from imgest.services.metadb import PostgresServer


def sql(pg: PostgresServer, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """QUERY's rows (ARGS bound), as the airflow user of PG."""
    import psycopg2

    conn = psycopg2.connect(host=pg.host, port=pg.port, user="airflow", password=pg.password, dbname="airflow")
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())
    finally:
        conn.close()
