"""Helpers for tests that drive ``acp-worker run`` as a child process."""

from __future__ import annotations

import subprocess
import threading


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for ``proc`` and return the rest of its stdout and stderr.

    Unlike ``Popen.communicate``, this reads through the text streams, so lines already
    buffered by an earlier ``for line in proc.stdout`` are not lost (``communicate`` reads
    the raw pipe and skips them).
    """
    got: dict[str, str] = {}

    def read(name: str) -> None:
        stream = getattr(proc, name)
        if stream is None:
            return
        with stream:
            got[name] = stream.read()

    readers = [
        threading.Thread(target=read, args=(name,), daemon=True) for name in ("stdout", "stderr")
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for reader in readers:
            reader.join(timeout=10)
    return got.get("stdout", ""), got.get("stderr", "")
