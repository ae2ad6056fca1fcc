"""The labels of docker sandboxes made another attempt's after their creation (a warm
slot claimed by its job, ``DockerBackend.assign``).

A container's labels are fixed when it is created, so a reassignment is recorded beside
the containers, on this host: one JSON file per sandbox id holding the labels the
sandbox has from then on (what ``list`` reports instead of its containers' own). The
record is written before anything relies on it and removed by ``destroy`` once the
containers are gone, so a sandbox is never listed with the slot's labels after its job
took it, and a destroy that dies half way is finished by the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from worker.errors import SandboxError


class Assignments:
    """The reassigned sandboxes' labels, one file per sandbox id in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}.json"

    def write(self, sandbox_id: str, labels: Mapping[str, str]) -> None:
        """Record ``labels`` as the sandbox's (atomically: a reader sees old or new).

        Raises:
            SandboxError: the record could not be written.
        """
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(dict(labels), out)
                os.replace(tmp, self._path(sandbox_id))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise SandboxError(
                f"docker sandbox: cannot record its labels: {exc.strerror or exc}",
                sandbox_id=sandbox_id,
            ) from exc

    def all(self) -> dict[str, dict[str, str]]:
        """Every record, by sandbox id (an unreadable or malformed one is skipped)."""
        found: dict[str, dict[str, str]] = {}
        try:
            paths = [p for p in self.root.iterdir() if p.suffix == ".json"]
        except FileNotFoundError:
            return found
        for path in paths:
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(raw, dict):
                found[path.stem] = {str(k): str(v) for k, v in raw.items()}
        return found

    def delete(self, sandbox_id: str) -> None:
        """Forget the sandbox's record (idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()
