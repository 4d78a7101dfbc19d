"""The cassandra-dali-plugin project's own example scripts, run as they ship against imgest's services.

The scripts (``extract_serial.py``, ``extract_spark.py``, ``cache_uuids.py``, ``loop_read.py``,
``create_split.py``) are not in the plugin's sdist: they live in its repository's ``examples/`` folder. imgest
finds them in ``$IMGEST_CRS4_EXAMPLES`` (a checkout of github.com/crs4/cassandra-dali-plugin or its ``examples``
folder), else in the archive ``cassandra-dali-plugin-examples-1.2.3.tar.gz`` under ``$IMGEST_PEER_VENDOR`` or
``../shared/vendor`` beside the checkout. Every script imports ``private_data.cass_conf`` for where Cassandra is;
:func:`prepare_examples` writes that file from imgest's settings. One line is changed, for DALI 2.x: the
``loop_read.py`` scripts ask for a CPU-only pipeline with ``device_id = types.CPU_ONLY_DEVICE_ID`` (-99999), which
DALI 2 takes for a GPU id and refuses without CUDA; DALI 2's CPU-only pipeline is ``device_id=None``
(:data:`CPU_ONLY_PATCH`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from imgest.core.errors import ConfigError
from imgest.core.paths import repo_root
from imgest.core.settings import CassandraSettings

ARCHIVE = "cassandra-dali-plugin-examples-1.2.3.tar.gz"
FOLDERS = ("common", "imagenette", "splitfile")
CPU_ONLY_PATCH = (
    ("device_id = types.CPU_ONLY_DEVICE_ID", "device_id = None  # imgest: DALI 2's CPU-only pipeline"),
    ("if device_id != types.CPU_ONLY_DEVICE_ID:", "if device_id is not None:"),
)


def examples_source() -> Path:
    """The plugin's examples: a folder ($IMGEST_CRS4_EXAMPLES) or the vendored archive; ConfigError naming both."""
    env = os.environ.get("IMGEST_CRS4_EXAMPLES")
    if env:
        path = Path(env).expanduser()
        path = path / "examples" if (path / "examples").is_dir() else path
        if not (path / "imagenette" / "loop_read.py").is_file():
            raise ConfigError(f"IMGEST_CRS4_EXAMPLES={env} holds no imagenette/loop_read.py (the plugin's examples)")
        return path
    vendor = Path(os.environ.get("IMGEST_PEER_VENDOR") or ((repo_root() or Path.cwd()) / ".." / "shared" / "vendor"))
    archive = vendor / ARCHIVE
    if not archive.is_file():
        raise ConfigError(
            f"cassandra-dali-plugin's example scripts are not here ({archive}): clone "
            "https://github.com/crs4/cassandra-dali-plugin and set IMGEST_CRS4_EXAMPLES to its examples folder"
        )
    return archive


def private_data(settings: CassandraSettings) -> str:
    """The ``private_data.py`` the scripts import: a CassandraConf pointing at SETTINGS."""
    lines = [
        "from crs4.cassandra_utils import CassandraConf",
        "",
        "cass_conf = CassandraConf()",
        f"cass_conf.cassandra_ips = {list(settings.hosts)!r}",
        f"cass_conf.cassandra_port = {settings.port}",
        f"cass_conf.username = {settings.username or ''!r}",
        f"cass_conf.password = {settings.password or ''!r}",
        f"cass_conf.use_ssl = {bool(settings.ssl_ca_file)!r}",
        f"cass_conf.ssl_certificate = {settings.ssl_ca_file or ''!r}",
        f"cass_conf.ssl_own_certificate = {settings.ssl_cert_file or ''!r}",
        f"cass_conf.ssl_own_key = {settings.ssl_key_file or ''!r}",
    ]
    return "\n".join(lines) + "\n"


def prepare_examples(dest: Path, settings: CassandraSettings) -> Path:
    """The plugin's example folders under DEST/examples, each with a private_data.py for SETTINGS; returns it."""
    src = examples_source()
    out = dest / "examples"
    if out.exists():
        shutil.rmtree(out)
    if src.is_dir():
        shutil.copytree(src, out)
    else:
        with tarfile.open(src) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(dest, filter="data")
        shutil.move(dest / top / "examples", out)
        shutil.rmtree(dest / top)
    for script in out.glob("*/loop_read.py"):
        text = script.read_text()
        for old, new in CPU_ONLY_PATCH:
            text = text.replace(old, new)
        script.write_text(text)
    for folder in FOLDERS:
        target = out / folder / "private_data.py"
        target.write_text(private_data(settings))
        target.chmod(0o600)  # it holds the password, as the plugin's own file does
    return out


def run_example(
    examples: Path, folder: str, script: str, args: list[str], timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the plugin's EXAMPLES/FOLDER/SCRIPT with ARGS as its README does (``python3 script ...`` in its folder),
    with this interpreter (the venv the plugin is installed in)."""
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=examples / folder,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def plugin_tables_cql(examples: Path, keyspace: str) -> list[str]:
    """The statements of the plugin's own ``imagenette/create_tables.cql`` (keyspace, data_train, metadata_train,
    data_val, metadata_val), with its keyspace ``imagenette`` renamed KEYSPACE."""
    from imgest.sinks.cassandra.schema import identifier

    identifier(keyspace, "keyspace")
    text = (examples / "imagenette" / "create_tables.cql").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.strip().startswith("//"))
    body = body.replace("EXISTS imagenette ", f"EXISTS {keyspace} ").replace("imagenette.", f"{keyspace}.")
    return [stmt.strip() for stmt in body.split(";") if stmt.strip()]
