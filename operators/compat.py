"""What differs between the Airflow lines imgest supports (3.1 to 3.3), in one place."""

from __future__ import annotations


def fail_exception() -> type[Exception]:
    """AirflowFailException (a task failure without retries): airflow.sdk.exceptions from 3.2 on, where
    airflow.exceptions' is deprecated; airflow.exceptions on 3.1, whose task SDK does not have it."""
    try:
        from airflow.sdk.exceptions import AirflowFailException
    except ImportError:  # Airflow 3.1
        from airflow.exceptions import AirflowFailException
    return AirflowFailException


def connection_or_none(conn_id: str):  # -> airflow Connection | None
    """The Airflow connection CONN_ID, None when it is not defined."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
