"""Cassandra target: client, CQL schema, bounded writer, Spark-side ingest, verification."""
