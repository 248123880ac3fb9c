"""The gateway's self-signed certificate: made once, reused, replaced when unusable, and
trusted by a client that is given the certificate file (a TLS handshake over loopback)."""

from __future__ import annotations

import os
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509

from raybus.http._tls import CERT_FILE, KEY_FILE, ensure_certificate


def test_a_certificate_is_made_once_and_reused(tmp_path: Path) -> None:
    certfile, keyfile = ensure_certificate(tmp_path / "certs")
    assert Path(certfile).name == CERT_FILE and Path(keyfile).name == KEY_FILE
    assert stat.S_IMODE(os.stat(keyfile).st_mode) == 0o600
    first = Path(certfile).read_bytes()
    assert ensure_certificate(tmp_path / "certs") == (certfile, keyfile)
    assert Path(certfile).read_bytes() == first
    cert = x509.load_pem_x509_certificate(first)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}


@pytest.mark.parametrize("damage", ["cert", "key", "mismatch"])
def test_an_unusable_pair_is_replaced(tmp_path: Path, damage: str) -> None:
    certfile, keyfile = ensure_certificate(tmp_path)
    before = Path(certfile).read_bytes()
    if damage == "cert":
        Path(certfile).write_bytes(b"garbage")
    elif damage == "key":
        Path(keyfile).unlink()
    else:
        other_cert, _ = ensure_certificate(tmp_path / "other")
        Path(certfile).write_bytes(Path(other_cert).read_bytes())
    ensure_certificate(tmp_path)
    after = Path(certfile).read_bytes()
    assert after != before and after != b"garbage"
    _handshake(certfile, keyfile, "localhost")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_client_trusting_the_file_completes_a_verified_handshake(
    tmp_path: Path, host: str
) -> None:
    certfile, keyfile = ensure_certificate(tmp_path)
    _handshake(certfile, keyfile, host)


def test_a_client_without_the_file_refuses_the_certificate(tmp_path: Path) -> None:
    certfile, keyfile = ensure_certificate(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certfile, keyfile, "localhost", trust=False)


def _handshake(certfile: str, keyfile: str, host: str, *, trust: bool = True) -> None:
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certfile, keyfile)
    client_context = ssl.create_default_context(cafile=certfile if trust else None)
    if not trust:
        client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no CAs at all
    # Python 3.13 turns this on by default; the certificate must pass it on older ones too.
    client_context.verify_flags |= getattr(ssl, "VERIFY_X509_STRICT", 0)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            assert tls.recv(2) == b"ok"
    finally:
        thread.join(timeout=10)
        listener.close()
