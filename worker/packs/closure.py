"""A closure: every file a pack runs with, pinned by path, mode, size and sha256.

The lock file ``lock/<platform>.json`` lists the closure of one platform; its
``closure_digest`` (see :func:`closure_digest`) is what the manifest pins and what names
the closure's folder in the cache.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.errors import DigestMismatch, InvalidInput
from worker.packs._io import invalid_input, read_json, write_json
from worker.packs.names import CLOSURE_DIGEST, SHA256_HEX, Platform, path_problem

Mode = Literal["0644", "0755"]


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One regular file of a closure."""

    path: str
    mode: Mode
    size: int
    sha256: str


def normalize_mode(st_mode: int) -> Mode:
    """``"0755"`` when any execute bit is set, else ``"0644"``."""
    return "0755" if st_mode & 0o111 else "0644"


def path_key(path: str) -> bytes:
    """Sort key of closure paths: their UTF-8 bytes."""
    return path.encode("utf-8")


def sort_entries(entries: Iterable[FileEntry]) -> tuple[FileEntry, ...]:
    """*entries* sorted by the UTF-8 bytes of their path."""
    return tuple(sorted(entries, key=lambda entry: path_key(entry.path)))


def closure_digest(entries: Iterable[FileEntry]) -> str:
    """The closure digest, defined here and nowhere else.

    sha256 over the UTF-8 bytes of one line per file,
    ``f"{mode} {size} {sha256} {path}\\n"``, with files sorted by the UTF-8 bytes of their
    path; written ``sha256:<hex>``. ``mode`` is the normalized ``0644``/``0755``,
    ``sha256`` lowercase hex, ``path`` relative POSIX without NUL or newline (so each line
    is unambiguous). Directories are implied by the paths and not hashed. Paths must be
    unique; the callers (lock file, extractor, tree scan) guarantee that.
    """
    digest = hashlib.sha256()
    for entry in sort_entries(entries):
        digest.update(f"{entry.mode} {entry.size} {entry.sha256} {entry.path}\n".encode())
    return f"sha256:{digest.hexdigest()}"


@dataclass(frozen=True, slots=True)
class ClosureLock:
    """The parsed ``lock/<platform>.json``: the inventory a closure must match exactly."""

    pack: str
    platform: Platform
    archive_sha256: str
    closure_digest: str
    files: tuple[FileEntry, ...]

    @classmethod
    def build(
        cls, *, pack: str, platform: Platform, archive_sha256: str, files: Iterable[FileEntry]
    ) -> ClosureLock:
        """A lock over *files*, sorted, with its closure digest computed."""
        ordered = sort_entries(files)
        return cls(pack, platform, archive_sha256, closure_digest(ordered), ordered)

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes."""
        return sum(entry.size for entry in self.files)

    def to_json(self) -> dict[str, object]:
        """The lock file's JSON object."""
        return {
            "schema": 1,
            "pack": self.pack,
            "platform": self.platform,
            "archive_sha256": self.archive_sha256,
            "closure_digest": self.closure_digest,
            "files": [
                {"path": e.path, "mode": e.mode, "size": e.size, "sha256": e.sha256}
                for e in self.files
            ],
        }


class _LockedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    mode: Mode
    size: int = Field(ge=0)
    sha256: Annotated[str, Field(pattern=SHA256_HEX)]

    @field_validator("path")
    @classmethod
    def _canonical(cls, value: str) -> str:
        problem = path_problem(value)
        if problem:
            raise ValueError(f"{problem}: {value!r}")
        return value


class _LockFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_version: Literal[1] = Field(alias="schema")
    pack: str
    platform: Platform
    archive_sha256: Annotated[str, Field(pattern=SHA256_HEX)]
    closure_digest: Annotated[str, Field(pattern=CLOSURE_DIGEST)]
    files: list[_LockedFile]

    @field_validator("files")
    @classmethod
    def _sorted_unique(cls, files: list[_LockedFile]) -> list[_LockedFile]:
        keys = [path_key(f.path) for f in files]
        if any(a >= b for a, b in itertools.pairwise(keys)):
            raise ValueError("files must be sorted by path (UTF-8 bytes) and unique")
        return files


def parse_lock(data: object, *, path: Path | str) -> ClosureLock:
    """Validate a lock file's JSON.

    Raises InvalidInput naming the field when malformed, DigestMismatch when its files do
    not hash to its own ``closure_digest``.
    """
    try:
        model = _LockFile.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, path=path) from exc
    files = tuple(FileEntry(f.path, f.mode, f.size, f.sha256) for f in model.files)
    actual = closure_digest(files)
    if actual != model.closure_digest:
        raise DigestMismatch(
            f"{path}: listed files hash to {actual}, not the recorded closure digest",
            path=str(path),
            expected=model.closure_digest,
            actual=actual,
        )
    return ClosureLock(model.pack, model.platform, model.archive_sha256, actual, files)


def read_lock(path: Path) -> ClosureLock:
    """Read and validate a lock file; raises InvalidInput (missing or malformed) or
    DigestMismatch (inconsistent, see :func:`parse_lock`)."""
    if not path.is_file():
        raise InvalidInput(f"lock file {path} is missing", path=str(path), field="lock")
    return parse_lock(read_json(path), path=path)


def write_lock(path: Path, lock: ClosureLock) -> None:
    """Write *lock* to *path* atomically."""
    write_json(path, lock.to_json())
