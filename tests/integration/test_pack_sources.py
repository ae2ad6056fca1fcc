"""Pack archives from HTTP(S) (a real server on loopback) and S3 (moto's server mode),
the one-download cache, and least-recently-used garbage collection."""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from worker.errors import ArchiveRefused, DigestMismatch
from worker.packs.cache import materialize
from worker.packs.gc import gc
from worker.packs.manifest import load_pack_dir
from worker.packs.sources import HttpsSource, S3Source, archive_path, fetch

REPO = Path(__file__).resolve().parents[2]
EMULATOR = REPO / "provider_packs" / "cursor-emulator"
PAYLOAD = os.urandom(300_000)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Server(http.server.ThreadingHTTPServer):
    files: dict[str, bytes]
    failures: dict[str, int]
    hits: dict[str, int]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.hits[self.path] = self.server.hits.get(self.path, 0) + 1
        if self.server.failures.get(self.path, 0) > 0:
            self.server.failures[self.path] -= 1
            self.send_error(503)
            return
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.files, srv.failures, srv.hits = {}, {}, {}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Server, path: str) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def test_https_source_streams_verifies_and_caches(server: _Server, tmp_path: Path) -> None:
    server.files["/a.tar"] = PAYLOAD
    source = HttpsSource(url=_url(server, "/a.tar"))
    first = fetch(source, tmp_path, sha256=SHA, size=len(PAYLOAD))
    assert first.downloaded
    assert first.path == archive_path(tmp_path, SHA)
    assert first.path.read_bytes() == PAYLOAD
    again = fetch(source, tmp_path, sha256=SHA, size=len(PAYLOAD))
    assert not again.downloaded
    assert server.hits["/a.tar"] == 1


def test_transient_errors_are_retried_with_backoff(server: _Server, tmp_path: Path) -> None:
    server.files["/a.tar"] = PAYLOAD
    server.failures["/a.tar"] = 2
    stats = fetch(
        HttpsSource(url=_url(server, "/a.tar")), tmp_path, sha256=SHA, size=len(PAYLOAD),
        backoff_s=0.01,
    )  # fmt: skip
    assert stats.attempts == 3


def test_persistent_errors_and_404_are_refused(server: _Server, tmp_path: Path) -> None:
    server.files["/a.tar"] = PAYLOAD
    server.failures["/a.tar"] = 10
    with pytest.raises(ArchiveRefused, match="after 3 attempts"):
        fetch(HttpsSource(url=_url(server, "/a.tar")), tmp_path, sha256=SHA,
              size=len(PAYLOAD), retries=3, backoff_s=0.01)  # fmt: skip
    with pytest.raises(ArchiveRefused, match="404"):
        fetch(HttpsSource(url=_url(server, "/none")), tmp_path, sha256=SHA, size=1)
    assert not archive_path(tmp_path, SHA).exists()


def test_wrong_or_oversized_bytes_never_enter_the_cache(server: _Server, tmp_path: Path) -> None:
    server.files["/evil.tar"] = PAYLOAD[:-1] + b"x"
    server.files["/big.tar"] = PAYLOAD + b"more"
    for path in ("/evil.tar", "/big.tar"):
        with pytest.raises(DigestMismatch):
            fetch(HttpsSource(url=_url(server, path)), tmp_path, sha256=SHA, size=len(PAYLOAD))
    assert list((tmp_path / "archives").iterdir()) == []


def test_plain_http_is_only_for_loopback() -> None:
    with pytest.raises(ValueError, match="url"):
        HttpsSource(url="http://example.com/a.tar")
    assert HttpsSource(url="https://example.com/a.tar").kind == "https"


def _fetch_in_process(url: str, cache: str) -> bool:
    return fetch(HttpsSource(url=url), Path(cache), sha256=SHA, size=len(PAYLOAD)).downloaded


def test_concurrent_workers_download_once(server: _Server, tmp_path: Path) -> None:
    server.files["/a.tar"] = PAYLOAD
    with ProcessPoolExecutor(4) as pool:
        results = list(pool.map(_fetch_in_process, [_url(server, "/a.tar")] * 8,
                                [str(tmp_path)] * 8))  # fmt: skip
    assert results.count(True) == 1
    assert server.hits["/a.tar"] == 1


def test_s3_source_against_moto(s3: Any, s3_endpoint: str, tmp_path: Path) -> None:
    s3.create_bucket(Bucket="packs")
    s3.put_object(Bucket="packs", Key="a/b.tar", Body=PAYLOAD)
    source = S3Source(bucket="packs", key="a/b.tar", endpoint_url=s3_endpoint)
    stats = fetch(source, tmp_path, sha256=SHA, size=len(PAYLOAD))
    assert stats.path.read_bytes() == PAYLOAD
    with pytest.raises(ArchiveRefused, match="S3 refused"):
        fetch(S3Source(bucket="packs", key="missing", endpoint_url=s3_endpoint), tmp_path,
              sha256="0" * 64, size=1)  # fmt: skip


def test_materialize_a_pack_whose_archive_is_remote(server: _Server, tmp_path: Path) -> None:
    pack_dir = tmp_path / "cursor-emulator"
    shutil.copytree(EMULATOR, pack_dir, ignore=shutil.ignore_patterns("dist", "src"))
    manifest = json.loads((pack_dir / "pack.json").read_text())
    pin = manifest["platforms"]["any"]["archive"]
    server.files["/emu.tar"] = (EMULATOR / pin["source"]).read_bytes()
    pin["source"] = {"kind": "https", "url": _url(server, "/emu.tar")}
    (pack_dir / "pack.json").write_text(json.dumps(manifest))
    closure = materialize(load_pack_dir(pack_dir), tmp_path / "cache")
    assert (closure / "cursor_emulator.py").is_file()
    assert closure.name == manifest["platforms"]["any"]["closure"]["digest"][7:]


def test_gc_removes_least_recently_used_first_and_skips_locked(tmp_path: Path) -> None:
    closures = tmp_path / "closures"
    new, mid, old, oldest = (c * 64 for c in "abcd")  # closure digests
    for age, name in enumerate([new, mid, old, oldest]):
        (closures / name).mkdir(parents=True)
        (closures / name / "f").write_bytes(b"x" * 1000)
        os.utime(closures / name, (1e9 - age * 100, 1e9 - age * 100))
    (tmp_path / "locks").mkdir()
    fd = os.open(tmp_path / "locks" / f"{oldest}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # "in use" by another materializer
        result = gc(tmp_path, budget_bytes=2000)
    finally:
        os.close(fd)
    assert result.removed == (old, mid)
    assert sorted(p.name for p in closures.iterdir()) == [new, oldest]
    assert result.freed_bytes == 2000
