"""CQL schemas of imgest, loaded by imgest.sinks.cassandra.schema (shipped as imgest.sql)."""
