"""Cursor's download, offline: the emulator packaged the way the vendor packages its CLI,
served over real HTTPS on loopback by a server whose certificate a test CA signed.

The vendor's Linux archive (``agent-cli-package.tar.gz``) holds one top-level
``dist-package/`` with a bundled ``node``, ``index.js`` and its chunks, and the
``cursor-agent`` launcher script that runs that ``node`` on ``index.js`` (the installer
links it as ``agent``). Here ``node`` is a stand-in that runs the emulator in place of
``index.js`` (and answers ``--version`` like the CLI), so the pack recipe's argv,
``{pack}/dist-package/node {pack}/dist-package/index.js <options> acp``, runs unchanged.

The server is ``test_pack_sources``' loopback file server wrapped in TLS; clients trust
the CA through ``SSL_CERT_FILE`` (OpenSSL's default verify paths, which urllib's default
context loads), as an operator behind a private CA would.
"""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import os
import ssl
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.integration.test_pack_sources import _Handler, _Server

REPO = Path(__file__).resolve().parents[2]
EMULATOR_SRC = REPO / "provider_packs" / "cursor-emulator" / "src"
#: What the stand-in answers to ``--version`` (the vendor's form, ``YYYY.MM.DD-<sha>``).
VERSION = "2026.09.26-emulator"

LAUNCHER = b"""#!/bin/sh
# The vendor's launcher: its bundled node on index.js, with the arguments given.
dir=$(dirname "$0")
exec "$dir/node" "$dir/index.js" "$@"
"""
NODE = f"""#!/bin/sh
# Stand-in for the bundled Node.js: runs the Cursor emulator in place of index.js.
dir=$(dirname "$0")
shift
if [ "$1" = "--version" ]; then echo "{VERSION}"; exit 0; fi
exec /usr/bin/python3 "$dir/cursor_emulator.py" "$@"
""".encode()
INDEX = b"// stand-in for Cursor's bundle: dist-package/node runs the emulator instead\n"


def vendor_archive() -> bytes:
    """``agent-cli-package.tar.gz`` laid out as the vendor's, holding the emulator."""
    members: list[tuple[str, bytes | None, int]] = [
        ("dist-package", None, 0o755),
        ("dist-package/cursor-agent", LAUNCHER, 0o755),
        ("dist-package/node", NODE, 0o755),
        ("dist-package/index.js", INDEX, 0o644),
    ]
    for path in sorted(EMULATOR_SRC.rglob("*")):
        if "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        name = f"dist-package/{path.relative_to(EMULATOR_SRC).as_posix()}"
        if path.is_dir():
            members.append((name, None, 0o755))
        else:
            mode = 0o755 if path.name == "cursor_emulator.py" else 0o644
            members.append((name, path.read_bytes(), mode))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.USTAR_FORMAT) as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass(frozen=True, slots=True)
class TlsServer:
    server: _Server
    ca_file: Path

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}{path}"


def _certificates(out: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 it signed: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acp-worker test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                       key_agreement=False, encipher_only=False, decipher_only=False),
                       critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=2))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    paths = out / "ca.pem", out / "cert.pem", out / "key.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(paths[2], 0o600)
    return paths


@contextmanager
def tls_server(out: Path) -> Iterator[TlsServer]:
    """The loopback file server over HTTPS; ``.server.files`` maps paths to bodies."""
    ca_file, cert, key = _certificates(out)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.files, srv.failures, srv.hits = {}, {}, {}
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield TlsServer(srv, ca_file)
    finally:
        srv.shutdown()
        srv.server_close()
