"""Where images go: Cassandra tables, webdataset shards (S3 or a folder)."""
