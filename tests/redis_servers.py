"""Real Redis servers for the TLS, ACL and Sentinel suites: Debian's ``redis-server``
(built with TLS) and ``redis-sentinel``, each on a free loopback port in a temp dir,
stopped by the test that started it. Certificates are made here (a CA, a server
certificate for ``localhost`` only, a client certificate) with ``cryptography``."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_SENTINEL = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
ADMIN_PASSWORD = "admin-pw-4d1c8e"  # the test's own superuser on the servers it starts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing the server presents


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    name: str,
    *,
    server: bool,
    loopback: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usage = [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
    if loopback:  # the servers of a Sentinel setup are clients too (replication, sentinels)
        usage.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:  # names localhost only (127.0.0.1 is the wrong server name) unless loopback
        names: list[x509.GeneralName] = [x509.DNSName(name)]
        if loopback:  # sentinels name the master by the address it was given: 127.0.0.1
            names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(where: Path, *, loopback: bool = False) -> Certs:
    """A CA and its certificates; with ``loopback`` the server certificate names
    127.0.0.1 too and serves as a client certificate (a Sentinel setup over TLS)."""
    where.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("acpw test CA")
    other, _ = _ca("acpw other CA")
    server, server_key = _leaf(ca, ca_key, "localhost", server=True, loopback=loopback)
    client, client_key = _leaf(ca, ca_key, "acpw-worker", server=False)
    pem = serialization.Encoding.PEM
    certs = Certs(
        ca=where / "ca.pem",
        server_cert=where / "server.pem",
        server_key=where / "server.key",
        client_cert=where / "client.pem",
        client_key=where / "client.key",
        other_ca=where / "other-ca.pem",
    )
    certs.ca.write_bytes(ca.public_bytes(pem))
    certs.other_ca.write_bytes(other.public_bytes(pem))
    certs.server_cert.write_bytes(server.public_bytes(pem))
    certs.client_cert.write_bytes(client.public_bytes(pem))
    _write_key(server_key, certs.server_key)
    _write_key(client_key, certs.client_key)
    return certs


@dataclass
class Server:
    """One redis-server or redis-sentinel process (``port``: its TLS port when it has
    TLS, else its plain one)."""

    proc: subprocess.Popen[bytes]
    port: int
    dir: Path
    tls: bool
    certs: Certs | None = None  # the test's CA and client certificate, for admin()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def sentinel(self) -> redis.Redis:
        """A client of this redis-sentinel (over TLS when it has TLS)."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=SENTINEL_PASSWORD,
            socket_timeout=5,
            **_client_tls(self.certs if self.tls else None),
        )

    def admin(self, certs: Certs | None = None) -> redis.Redis:
        certs = certs or self.certs
        kwargs: dict[str, object] = {"password": ADMIN_PASSWORD, "socket_timeout": 5}
        if self.tls and certs is not None:
            kwargs.update(
                ssl=True,
                ssl_ca_certs=str(certs.ca),
                ssl_certfile=str(certs.client_cert),
                ssl_keyfile=str(certs.client_key),
            )
        return redis.Redis(host="localhost" if self.tls else "127.0.0.1", port=self.port, **kwargs)


def _client_tls(certs: Certs | None) -> dict[str, object]:
    if certs is None:
        return {}
    return {"ssl": True, "ssl_ca_certs": str(certs.ca)}


def _tls_args(certs: Certs, port: int) -> list[str]:
    return [
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(certs.server_cert),
        "--tls-key-file",
        str(certs.server_key),
        "--tls-ca-cert-file",
        str(certs.ca),
        "--tls-auth-clients",
        "optional",
        "--tls-replication",
        "yes",
    ]


def start_redis(
    where: Path,
    *,
    certs: Certs | None = None,
    users: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> Server:
    """A redis-server on a free loopback port (TLS only when ``certs`` is given); the
    ``default`` user takes ``ADMIN_PASSWORD``; each of ``users`` is an ACL rule line
    (``name on >pw ~keys +cmds``), each of ``extra`` a line of the config file."""
    where.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lines = ["bind 127.0.0.1", f"dir {where}", 'save ""', "appendonly no"]
    lines += ["protected-mode yes", "daemonize no", f"logfile {where / 'redis.log'}"]
    lines += ["repl-diskless-sync-delay 0"]  # a replica syncs at once, not 5 s later
    tls = _tls_args(certs, port) if certs else ["--port", str(port)]
    lines += [f"{tls[i].removeprefix('--')} {tls[i + 1]}" for i in range(0, len(tls), 2)]
    lines += [f"user default on >{ADMIN_PASSWORD} ~* &* +@all"]
    lines += [f"user {rule}" for rule in users]
    lines += list(extra)
    conf = where / "redis.conf"
    conf.write_text("\n".join(lines) + "\n")
    argv = [REDIS_SERVER, str(conf)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Server(proc, port, where, tls=certs is not None, certs=certs)
    _wait_up(server, certs)
    return server


def _wait_up(server: Server, certs: Certs | None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            log = server.dir / "redis.log"
            text = log.read_text() if log.exists() else ""
            raise RuntimeError(f"redis exited {server.proc.returncode}: {text[-2000:]}")
        try:
            with contextlib.closing(server.admin(certs)) as client:
                client.ping()
        except redis.exceptions.RedisError as exc:
            last = exc
            time.sleep(0.05)
        else:
            return
    server.stop()
    raise RuntimeError(f"redis on port {server.port} did not come up: {last}")


def wait_replica_online(primary: Server, timeout: float = 20.0) -> None:
    """Until ``primary`` has a replica that finished its sync (``WAIT`` counts only it)."""
    deadline = time.monotonic() + timeout
    with contextlib.closing(primary.admin()) as admin:
        while admin.info("replication").get("slave0", {}).get("state") != "online":
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no replica of {primary.port} online: {admin.info('replication')}"
                )
            time.sleep(0.05)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()


SENTINEL_PASSWORD = "sentinel-pw-61a0c2"  # the sentinels' own AUTH (requirepass)
MASTER = "acpw-master"


def start_sentinel(
    where: Path, primary_port: int, *, quorum: int = 2, certs: Certs | None = None
) -> Server:
    """A redis-sentinel watching the primary on ``primary_port`` (failover after 1 s
    unreachable), asking clients for ``SENTINEL_PASSWORD``; with ``certs``, TLS only, for
    its clients as for its own links to the servers and the other sentinels."""
    where.mkdir(parents=True, exist_ok=True)
    port = free_port()
    tls = _tls_args(certs, port) if certs else ["--port", str(port)]
    lines = [
        *(f"{tls[i].removeprefix('--')} {tls[i + 1]}" for i in range(0, len(tls), 2)),
        "bind 127.0.0.1",
        f"dir {where}",
        "daemonize no",
        f"logfile {where / 'redis.log'}",
        f"requirepass {SENTINEL_PASSWORD}",
        f"sentinel sentinel-pass {SENTINEL_PASSWORD}",
        f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} {quorum}",
        f"sentinel auth-pass {MASTER} {ADMIN_PASSWORD}",
        f"sentinel down-after-milliseconds {MASTER} 1000",
        f"sentinel failover-timeout {MASTER} 10000",
        f"sentinel parallel-syncs {MASTER} 1",
    ]
    conf = where / "sentinel.conf"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [REDIS_SENTINEL, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = Server(proc, port, where, tls=certs is not None, certs=certs)
    deadline = time.monotonic() + 20
    while True:
        try:
            with contextlib.closing(server.sentinel()) as client:
                client.ping()
        except redis.exceptions.RedisError:
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.05)
        else:
            return server
