"""`imgest adopt`: record tables another writer filled as an imgest dataset version, in place."""

from __future__ import annotations

import argparse

from imgest.cli.common import add_cassandra_args, cassandra_settings


def adopt_crs4_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.sinks.cassandra.adopt import adopt_tables
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(cassandra_settings(args)) as session:
        report = adopt_tables(session, args.data_table, args.metadata_table, args.dataset, args.version)
    print(json.dumps(report.to_dict(), indent=2))
    print(
        f"adopted: {report.rows} rows ({report.bytes / 1e6:.1f} MB) of {args.data_table} are version {report.version} "
        f"of dataset {report.dataset!r}, complete; read them with imgest's readers, split them with `imgest split "
        f"--data-table {args.data_table} --metadata-table {args.metadata_table} --dataset {report.dataset}`"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    adopt = sub.add_parser(
        "adopt",
        help="record tables another tool filled as an imgest dataset version (in place)",
        description="Adopt tables filled by another writer so that imgest's readers, splits and checks can use them.",
    )
    kinds = adopt.add_subparsers(dest="kind", metavar="KIND", required=True)
    crs4 = kinds.add_parser(
        "crs4",
        help="tables filled by cassandra-dali-plugin's extract_serial.py / extract_spark.py",
        description="Reads the data table once (token ranges, bounded pages) to record each row's sha256 and size "
        "in the metadata table, adds the columns imgest's metadata has (the plugin's scripts do not see them), takes "
        "split and class names from or_split / or_label, and writes a complete dataset_versions record. The plugin's "
        "labels are kept: its class numbering (the order os.scandir listed the folders) becomes the class map. "
        "Tables must be named data + metadata, or data_<split> + metadata_<split>, in one keyspace.",
    )
    crs4.add_argument("--data-table", required=True, help="keyspace.table of the images (id, label, data)")
    crs4.add_argument("--metadata-table", required=True, help="keyspace.table of its metadata (id, label, ...)")
    crs4.add_argument("--dataset", required=True, help="name of the dataset the version belongs to")
    crs4.add_argument("--version", help="version name (default adopted-<hash of the table names>)")
    add_cassandra_args(crs4)
    crs4.set_defaults(func=adopt_crs4_cmd)
