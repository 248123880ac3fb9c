"""A self-signed certificate for the HTTPS gateway, made once per directory.

The Azure SDK's ``ServiceBusAdministrationClient`` (7.15) always calls
``https://{endpoint}`` (the port of the connection string's ``Endpoint``, 443 when it has
none) and cannot be told to use plain HTTP, so raybus's management API needs TLS even on a
laptop. ``ensure_certificate`` makes a certificate for ``localhost``, ``127.0.0.1`` and
``::1`` that clients trust by pointing at the certificate file itself::

    ServiceBusAdministrationClient.from_connection_string(conn, connection_verify=certfile)

or, for every ``requests``-based client in the process, ``REQUESTS_CA_BUNDLE=<certfile>``
(``SSL_CERT_FILE`` for clients that use Python's default SSL context).

The certificate is its own issuer and marked as a CA (``BasicConstraints(ca=True)``), with
subject and authority key identifiers: OpenSSL's strict verification (Python 3.13's default)
rejects a self-signed leaf that lacks them. The key is ECDSA P-256, written with mode 0600.
An existing pair is reused while it is valid for at least another day and names the hosts
above; otherwise a new one replaces it. A file lock makes concurrent callers agree on one
pair.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CERT_FILE", "KEY_FILE", "ensure_certificate"]

CERT_FILE = "raybus-gateway.crt"
KEY_FILE = "raybus-gateway.key"
VALIDITY = dt.timedelta(days=365)
_DNS_NAMES = ("localhost",)
_IP_ADDRESSES = ("127.0.0.1", "::1")


def ensure_certificate(directory: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(certfile, keyfile)`` in ``directory``, creating the directory and a new
    self-signed certificate when there is no usable one."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / CERT_FILE, folder / KEY_FILE
    with open(folder / ".raybus-gateway.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _usable(cert_path, key_path):
            _write(cert_path, key_path)
    return str(cert_path), str(key_path)


def _usable(cert_path: Path, key_path: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    if cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        return False
    if cert.not_valid_after_utc < dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1):
        return False
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    return (
        set(_DNS_NAMES) <= set(names.get_values_for_type(x509.DNSName))
        and set(_IP_ADDRESSES) <= ips
    )


def _write(cert_path: Path, key_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raybus gateway (localhost)")])
    now = dt.datetime.now(dt.timezone.utc)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in _DNS_NAMES]
                + [x509.IPAddress(ipaddress.ip_address(a)) for a in _IP_ADDRESSES]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Key first, each written to a temporary name and renamed: a reader never sees half a
    # file, and a certificate on disk always has its key beside it.
    _replace(key_path, key_bytes, 0o600)
    _replace(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _replace(path: Path, data: bytes, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
