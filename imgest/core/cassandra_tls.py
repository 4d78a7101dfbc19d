"""Cassandra TLS material as connections carry it: a CA, and for mutual TLS a client certificate and key.

Each comes as a file path (``--ssl-ca`` / ``--ssl-cert`` / ``--ssl-key``, ``IMGEST_CASSANDRA_SSL_CA`` / ``_CERT`` /
``_KEY``, the connection's ``ssl_options``) or as the PEM text itself (the connection's ``ssl_ca`` / ``ssl_cert`` /
``ssl_key`` extras may hold either; ``IMGEST_CASSANDRA_SSL_CA_PEM`` / ``_CERT_PEM`` / ``_KEY_PEM`` for a job's
environment). A driver reads the files once and ships the texts inside the task objects (``shippable``), so
executors and the bulk helper on other hosts need no file of the submitting host. The key travels as unencrypted
PKCS#8 PEM, the form both the Python driver and the Java helper load; a key file with a passphrase is refused by
name. The Python driver's ``ssl.SSLContext`` loads a certificate chain only from files: ``ssl_context`` writes the
texts to a private temporary folder, loads them and removes them at once.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

from imgest.core.errors import ConfigError

PEM_MARK = "-----BEGIN "


def is_pem(value: str | None) -> bool:
    """VALUE is PEM text rather than a path."""
    return bool(value) and str(value).lstrip().startswith(PEM_MARK)


def read_pem(path: str, what: str, setting: str) -> str:
    """The text of the PEM file PATH; ConfigError naming WHAT and the SETTING to check."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"Cassandra {what} file {path}: {exc.strerror}; check {setting}") from None


def pkcs8(key_pem: str) -> str:
    """KEY_PEM (PKCS#1, SEC1 or PKCS#8, unencrypted) as PKCS#8 PEM; ConfigError for a key that needs a passphrase."""
    if "BEGIN PRIVATE KEY" in key_pem:
        return key_pem
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the Cassandra client key cannot be read ({exc}): give an unencrypted PEM key (PKCS#8, PKCS#1 or SEC1)"
        ) from None
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def ssl_context(ca: str | None, ca_file: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """A client context trusting CA (text) or CA_FILE and, with CERT and KEY (texts), presenting that certificate."""
    context = ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context(cafile=ca_file)
    if cert and key:
        with tempfile.TemporaryDirectory(prefix="imgest-tls-") as folder:  # 0700; removed on exit
            paths = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            for path, text in zip(paths, (cert, key), strict=True):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)
            context.load_cert_chain(str(paths[0]), str(paths[1]))
    return context
