"""The embedded services' settings as environment variables: what `imgest services env` prints.

No code path reaches a store at 127.0.0.1 by itself (``imgest.core.settings``); a person, the demo, the test
suite and the embedded Airflow deployments reach the embedded servers because these variables say where they are.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from imgest.core.settings import CREDENTIALS_FILE_ENV, HOSTS_ENV


def embedded_env() -> dict[str, str]:
    """IMGEST_CASSANDRA_HOSTS / _PORT, IMGEST_S3_ENDPOINT, IMGEST_S3_CREDENTIALS_FILE and IMGEST_S3_BUCKET of the
    embedded Cassandra and S3 servers (`imgest services up`)."""
    from imgest.services.cassandra import CassandraServer
    from imgest.services.s3 import S3Server

    cassandra, s3 = CassandraServer.default(), S3Server.default()
    return {
        HOSTS_ENV: cassandra.host,
        "IMGEST_CASSANDRA_PORT": str(cassandra.native_port),
        "IMGEST_S3_ENDPOINT": s3.endpoint,
        CREDENTIALS_FILE_ENV: str(s3.home / "credentials.json"),
        "IMGEST_S3_BUCKET": s3.bucket,  # the DAG's destination when the trigger names none
    }


def use_embedded(env: MutableMapping[str, str] = os.environ) -> MutableMapping[str, str]:
    """ENV with the embedded services' settings where it names none of its own (the process's environment by
    default: the demo and the test suite, as after `eval "$(imgest services env)"`)."""
    for key, value in embedded_env().items():
        env.setdefault(key, value)
    return env
