"""check_datasets: an Airflow DAG run when a dataset version is announced (an Asset event through `imgest-datasets`).

Built by imgest's factory (imgest.operators.check_dag.check_datasets_dag): for each new version it runs the DALI
read-back throughput check of every reader of its target (and the xNVMe validation for the files target) through
the connections of the DAG that published it, and records the reports with the version (`dataset_versions.checks`
for Cassandra, `manifest.json` `checks` for shards). Versions their producer already checked are skipped.
"""

from __future__ import annotations

from imgest.operators.check_dag import check_datasets_dag

dag = check_datasets_dag()
