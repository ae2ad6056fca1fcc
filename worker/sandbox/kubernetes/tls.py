"""The TLS of the proxy front: a key and a self-signed certificate made in memory each
time the front starts listening, pinned by the pods' forwarders.

The certificate is no identity anyone else vouches for: the backend hands it to each
forwarder it starts (``ACPW_PROXY_CA``), and the forwarder trusts that certificate alone,
whatever the front's address or name (no host name check: a pin, not a PKI). So what
crosses the pod network between a sandbox pod and the worker — the job's token first,
then the relayed bytes — is encrypted, and a host that answers in the front's place
(an address taken over on the pod network) has no key for the pinned certificate: the
forwarder's handshake fails and nothing is sent. The key never leaves this process; a
front that stops (its last job ended) and listens again makes a new pair.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

#: The certificate's lifetime: longer than any worker process (it is made per listen).
VALIDITY = timedelta(days=3650)


def front_tls() -> tuple[ssl.SSLContext, str]:
    """A server context holding a new key and its self-signed certificate; and that
    certificate as PEM, for the forwarders to pin."""
    from cryptography import x509  # only a kubernetes front with allowlist jobs needs it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acp-worker proxy front")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        # Its own trust anchor: the forwarders load it as their only CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # load_cert_chain reads files only: a private directory, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="acpw-front-") as folder:
        cert_file, key_file = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert_file.write_bytes(cert_pem)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key_pem)
        context.load_cert_chain(cert_file, key_file)
    return context, cert_pem.decode("ascii")
