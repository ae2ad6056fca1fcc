"""The built-in secret sources: ``env:NAME`` and ``file:PATH``.

``env:NAME`` reads the worker's own environment; ``file:PATH`` reads a regular file under
the secrets directory (``ACPW_SECRETS_DIR``), never following a link out of it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from worker.credentials.sources import MAX_SECRET_BYTES, SourceContext
from worker.errors import CredentialRefused


class EnvSource:
    """``env:NAME``: a variable of the worker's environment."""

    scheme = "env"

    def __init__(self, context: SourceContext) -> None:
        self._environ = context.environ

    def resolve(self, where: str, *, name: str) -> str:
        value = self._environ.get(where, "")
        if not value:
            raise CredentialRefused(
                f"credential {name}: environment variable {where} is not set",
                name=name,
                reason="unresolved",
            )
        return value


class FileSource:
    """``file:PATH``: a file under the secrets directory, stripped of surrounding space."""

    scheme = "file"

    def __init__(self, context: SourceContext) -> None:
        self._root = context.settings.secrets_dir

    def resolve(self, where: str, *, name: str) -> str:
        if self._root is None:
            raise CredentialRefused(
                f"credential {name}: file references need a secrets directory (ACPW_SECRETS_DIR)",
                name=name,
                reason="no_secrets_dir",
            )
        root = self._root.resolve()
        path = (root / where).resolve()
        if not path.is_relative_to(root):
            raise CredentialRefused(
                f"credential {name}: file reference escapes the secrets directory",
                name=name,
                reason="outside_secrets_dir",
            )
        return _decode(name, _read(name, path))


def _read(name: str, path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CredentialRefused(
            f"credential {name}: cannot read its file ({exc.strerror})",
            name=name,
            reason="unresolved",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SECRET_BYTES:
            raise CredentialRefused(
                f"credential {name}: its file is not a regular file of at most 64 KiB",
                name=name,
                reason="unresolved",
            )
        return handle.read(MAX_SECRET_BYTES + 1)


def _decode(name: str, raw: bytes) -> str:
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        value = ""
    if not value:
        raise CredentialRefused(
            f"credential {name}: its file is empty or not UTF-8 text",
            name=name,
            reason="unresolved",
        )
    return value
