"""What the DAG files share: the `imgest-datasets` alias, the scan's templated results, and the publish step that
announces a stored dataset version as an Asset (ingest_imagenet, refresh_<name>; check_datasets listens)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

if TYPE_CHECKING:
    from imgest.operators.dag_connections import DagConnections

DATASETS_ALIAS = "imgest-datasets"
DATASETS = AssetAlias(DATASETS_ALIAS)
# The scan task's results, as templates every later task of a run reads.
MANIFEST_DIR = "{{ ti.xcom_pull(task_ids='scan')['manifest_dir'] }}"
SOURCE_CONN = "{{ ti.xcom_pull(task_ids='scan').get('source_conn_id', '') }}"  # an s3:// source's connection


def announce(
    conf: dict[str, Any], extra: dict[str, Any], outlet_events: Any, connections: DagConnections | None = None
) -> str:
    """Add the Asset of the dataset CONF describes (its Cassandra tables, shard prefix or folder) to the
    `imgest-datasets` alias with EXTRA and the DAG's CONNECTIONS (a DagConnections; the defaults when None: what
    check_datasets reads the version through); returns its URI. Only the Cassandra target reads the Cassandra
    connection (its address names the tables), so a shards-only deployment needs none."""
    from imgest.flow.request import IngestRequest
    from imgest.flow.steps import asset_uri
    from imgest.operators.dag_connections import DEFAULT

    address = ""
    if IngestRequest.from_conf(conf).target == "cassandra":
        from imgest.operators.hooks import ImgestCassandraHook

        settings = ImgestCassandraHook((connections or DEFAULT).cassandra).settings()
        address = f"{settings.hosts[0]}:{settings.port}"
    uri = asset_uri(conf, address)
    outlet_events[DATASETS].add(Asset(uri), extra={**extra, "connections": (connections or DEFAULT).to_extra()})
    return uri
