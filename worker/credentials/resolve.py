"""Resolving a job's credential references into values, only for names the pack allows.

A job never carries a secret: it names a credential and says where the worker finds it
(``env:NAME`` in the worker's environment, ``file:PATH`` under the configured secrets
directory). Anything missing, unknown to the pack or unresolvable refuses the job with
``credential_refused`` before anything starts. The refusal never contains the value.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.credentials.redact import Redactor
from worker.errors import CredentialRefused

MAX_SECRET_BYTES = 64 * 1024


def resolve_credentials(
    refs: Mapping[str, str],
    *,
    allowed: Sequence[str],
    environ: Mapping[str, str],
    secrets_dir: Path | None,
    redactor: Redactor,
) -> dict[str, str]:
    """Values for ``refs``; every value is registered with ``redactor`` before returning.

    Raises:
        CredentialRefused: a name the pack does not accept, or a reference that does not
            resolve (missing variable, file outside the secrets directory, unreadable).
    """
    values: dict[str, str] = {}
    for name, ref in refs.items():
        if name not in allowed:
            raise CredentialRefused(
                f"credential {name} is not accepted by this pack",
                name=name,
                reason="not_allowed",
                allowed=list(allowed),
            )
        value = _resolve(name, ref, environ=environ, secrets_dir=secrets_dir)
        redactor.register(value)
        values[name] = value
    return values


def _resolve(name: str, ref: str, *, environ: Mapping[str, str], secrets_dir: Path | None) -> str:
    kind, _, where = ref.partition(":")
    if kind == "env":
        value = environ.get(where, "")
        if not value:
            raise CredentialRefused(
                f"credential {name}: environment variable {where} is not set",
                name=name,
                reason="unresolved",
            )
        return value
    return _read_file(name, where, secrets_dir)


def _read_file(name: str, where: str, secrets_dir: Path | None) -> str:
    if secrets_dir is None:
        raise CredentialRefused(
            f"credential {name}: file references need a secrets directory (ACPW_SECRETS_DIR)",
            name=name,
            reason="no_secrets_dir",
        )
    root = secrets_dir.resolve()
    path = (root / where).resolve()
    if not path.is_relative_to(root):
        raise CredentialRefused(
            f"credential {name}: file reference escapes the secrets directory",
            name=name,
            reason="outside_secrets_dir",
        )
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
        raw = handle.read()
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
