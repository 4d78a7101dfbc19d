"""Certificates for the TLS-enabled embedded Cassandra node: a private CA, a server key pair and a client one.

The CA certificate (``ca.pem``) is what clients trust (``IMGEST_CASSANDRA_SSL_CA``, ``--ssl-ca``, the
connection extra ``ssl_ca``); the server's key and certificate go into a PKCS12 keystore that Cassandra's
``client_encryption_options`` read. The certificate names the node's IP address, so clients check the host. The node
requires a client certificate signed by the same CA (mutual TLS, ``require_client_auth``; the CA in a PKCS12
truststore made by the JDK's keytool): ``client.pem`` and ``client-key.pem`` are the client's (``--ssl-cert`` /
``--ssl-key``, the connection extras ``ssl_cert`` / ``ssl_key``).
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
    truststore: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None


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
    _client_pair(folder, ca_key, ca_name, now, days)
    _truststore(tls.ca_pem, folder / "truststore.p12", password)
    return load_server_tls(folder) or tls


def _client_pair(folder: Path, ca_key: object, ca_name: object, now: datetime.datetime, days: int) -> None:
    """A client certificate signed by the CA (CA_KEY, CA_NAME) and its key, as FOLDER/client.pem, client-key.pem."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "imgest client")]))
        .issuer_name(ca_name)  # type: ignore[arg-type]
        .public_key(client_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (folder / "client.pem").write_bytes(client.public_bytes(serialization.Encoding.PEM))
    key_pem = client_key.private_bytes(  # SEC1 ("EC PRIVATE KEY"), as openssl writes it: imgest converts it
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    _write_private(folder / "client-key.pem", key_pem)


def _truststore(ca_pem: Path, path: Path, password: str) -> None:
    """A PKCS12 truststore holding CA_PEM as a trusted certificate (the JDK's keytool: Java reads trust only from
    its own attribute, which Python's PKCS12 writer does not set)."""
    import shutil
    import subprocess

    keytool = shutil.which("keytool", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) or shutil.which(
        "keytool"
    )
    if keytool is None:
        from imgest.core.errors import ServiceError

        raise ServiceError("cassandra-tls: keytool (a JDK's) not found; install a JDK 17 or set JAVA_HOME")
    path.unlink(missing_ok=True)
    store = ["-keystore", str(path), "-storetype", "PKCS12", "-storepass:env", "IMGEST_TRUSTSTORE_PASSWORD"]
    subprocess.run(
        [keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), *store],
        env={**os.environ, "IMGEST_TRUSTSTORE_PASSWORD": password},  # never on a command line
        check=True,
        capture_output=True,
    )
    path.chmod(0o600)


def load_server_tls(folder: Path) -> ServerTls | None:
    """The TLS material made earlier in FOLDER, or None."""
    files = folder / "ca.pem", folder / "keystore.p12", folder / "keystore.password"
    client = folder / "truststore.p12", folder / "client.pem", folder / "client-key.pem"
    if not all(f.is_file() for f in (*files, *client)):
        return None  # made before mutual TLS: made again
    return ServerTls(files[0], files[1], files[2].read_text().strip(), *client)


def client_encryption_yaml(tls: ServerTls) -> str:
    """cassandra.yaml's client_encryption_options: TLS required on the native port, and a client certificate
    signed by the CA (mutual TLS)."""
    return (
        "client_encryption_options:\n"
        "  enabled: true\n"
        "  optional: false\n"
        f"  keystore: {tls.keystore}\n"
        f"  keystore_password: {tls.keystore_password}\n"
        "  store_type: PKCS12\n"
        "  require_client_auth: true\n"
        f"  truststore: {tls.truststore}\n"
        f"  truststore_password: {tls.keystore_password}\n"
    )
