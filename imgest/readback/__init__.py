"""Reading stored datasets back at training speed (DALI readers), and proving what was read."""

from imgest.readback.api import CassandraSource, get_cassandra_reader
from imgest.readback.cassandra import CassandraReader, CassandraReadOptions
from imgest.readback.resume import ReaderState
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions

__all__ = [
    "CassandraReadOptions",
    "CassandraReader",
    "CassandraSource",
    "ReaderState",
    "S3ShardStream",
    "S3StreamOptions",
    "get_cassandra_reader",
]
