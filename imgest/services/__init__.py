"""Embedded services imgest starts for a one-machine setup: Cassandra, S3 (SeaweedFS), Airflow."""

from __future__ import annotations

from imgest.core.errors import ConfigError
from imgest.services.airflow import AirflowServer
from imgest.services.base import Service, ServiceStatus, UpResult
from imgest.services.cassandra import CassandraServer
from imgest.services.s3 import S3Server

SERVICE_NAMES = ("cassandra", "s3", "airflow")  # what `imgest services up` starts when none is named
ALL_SERVICE_NAMES = (
    "cassandra",
    "cassandra-auth",
    "cassandra-tls",
    "cassandra-ring",
    "s3",
    "airflow",
    "airflow-celery",
    "latency-proxy",
    "aws",
    "spark-connect",
    "spark",
    "hosts",
)  # what `down` stops


def _latency_proxy() -> Service:
    from imgest.services.latency import LatencyProxy

    return LatencyProxy.default()


def _ring() -> Service:
    from imgest.services.ring import CassandraRing

    return CassandraRing.default()


def _airflow_celery() -> Service:
    from imgest.services.airflow_celery import CeleryAirflow

    return CeleryAirflow.default()


def _strict_aws() -> Service:
    from imgest.services.strict_aws import StrictAws

    return StrictAws.default()


def _spark() -> Service:
    from imgest.services.spark_cluster import SparkCluster

    return SparkCluster.default()


def _spark_connect() -> Service:
    from imgest.services.spark_connect import SparkConnectServer

    return SparkConnectServer.default()


def _hosts() -> Service:
    from imgest.services.hosts import SimulatedHosts

    return SimulatedHosts.default()


def get_service(name: str) -> Service:
    """The embedded service called NAME (cassandra, cassandra-auth, cassandra-tls, cassandra-ring, s3, airflow,
    airflow-celery, latency-proxy, aws, spark, spark-connect, hosts)."""
    factories = {
        "cassandra": CassandraServer.default,
        "cassandra-auth": lambda: CassandraServer.default(auth=True),
        "cassandra-tls": lambda: CassandraServer.default(tls=True),
        "cassandra-ring": _ring,
        "s3": S3Server.default,
        "airflow": AirflowServer.default,
        "airflow-celery": _airflow_celery,
        "latency-proxy": _latency_proxy,
        "aws": _strict_aws,
        "spark": _spark,
        "spark-connect": _spark_connect,
        "hosts": _hosts,
    }
    if name not in factories:
        raise ConfigError(f"unknown service {name!r}; choose from {', '.join(factories)}")
    return factories[name]()


__all__ = [
    "ALL_SERVICE_NAMES",
    "SERVICE_NAMES",
    "AirflowServer",
    "CassandraServer",
    "S3Server",
    "Service",
    "ServiceStatus",
    "UpResult",
    "get_service",
]
