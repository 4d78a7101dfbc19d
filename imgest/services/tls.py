"""Certificates for the TLS-enabled embedded Cassandra node: a private CA and a server key pair.

The CA certificate (``ca.pem``) is what clients trust (``IMGEST_CASSANDRA_SSL_CA``, ``--ssl-ca``, the
connection extra ``ssl_ca``); the server's key and certificate go into a PKCS12 keystore that Cassandra's
``client_encryption_options`` read. The certificate names the node's IP address, so clients check the host.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerTls:
    """Where a node's TLS material lives."""

    ca_pem: Path
    keystore: Path
    keystore_password: str


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def make_server_tls(folder: Path, host: str, days: int = 30) -> ServerTls:
    """A new CA and a server certificate for HOST (IP or name) signed by it, written under FOLDER."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "imgest test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    password = secrets.token_urlsafe(18)
    encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(50000)
        .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
        .hmac_hash(hashes.SHA256())
        .build(password.encode())
    )
    p12 = pkcs12.serialize_key_and_certificates(b"imgest", key, cert, [ca], encryption)
    tls = ServerTls(folder / "ca.pem", folder / "keystore.p12", password)
    tls.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(tls.keystore, p12)
    _write_private(folder / "keystore.password", password.encode())
    return tls


def load_server_tls(folder: Path) -> ServerTls | None:
    """The TLS material made earlier in FOLDER, or None."""
    files = folder / "ca.pem", folder / "keystore.p12", folder / "keystore.password"
    if not all(f.is_file() for f in files):
        return None
    return ServerTls(files[0], files[1], files[2].read_text().strip())


def client_encryption_yaml(tls: ServerTls) -> str:
    """cassandra.yaml's client_encryption_options: TLS required on the native port, no client certificates."""
    return (
        "client_encryption_options:\n"
        "  enabled: true\n"
        "  optional: false\n"
        f"  keystore: {tls.keystore}\n"
        f"  keystore_password: {tls.keystore_password}\n"
        "  store_type: PKCS12\n"
        "  require_client_auth: false\n"
    )
