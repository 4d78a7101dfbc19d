"""ingest_imagenet: scan a dataset, then Spark-ingest it into Cassandra tables or webdataset shards on S3.

Built by imgest's factory (imgest.operators.ingest_dag.ingest_imagenet_dag) with the default DAG id and connection
ids (cassandra_default, aws_default, spark_default). Trigger from the UI's form or:
airflow dags trigger ingest_imagenet --conf '{"sample": true, "target": "shards"}'
"""

from __future__ import annotations

from imgest.operators.ingest_dag import ingest_imagenet_dag

dag = ingest_imagenet_dag()
