"""A pack's files in its agent's HOME: the agent's private configuration.

A sandbox's HOME is an empty tmpfs. A pack that must configure its agent by file (codex
reads ``$CODEX_HOME/config.toml``; gemini-cli ``~/.gemini/settings.json``) declares the
files (``launch.files``, and with a model endpoint ``launch.endpoint.files`` in place of
the same paths, ``{endpoint}`` standing for the endpoint's URL as the agent reaches it;
then, when the job names its model by a plain id, ``launch.model_files`` put at the start
of the same paths, ``{model}`` standing for that id).
The worker writes them into a fresh directory of the job's work directory, one
subdirectory per top-level directory of HOME they are in, owned by the sandbox's host
user, and binds each read-write at that place of HOME: the agent may add to them (its
logs, its state) as it would to its own home.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from worker.errors import SandboxError
from worker.launch import expand
from worker.packs.manifest import Launch
from worker.sandbox.base import HOME, WritableMount

#: The directory under the job's work directory that holds them.
HOME_FILES_DIR = "home-files"


#: A model id written into a config file: only one that needs no quoting in TOML, JSON or
#: YAML (a job's ``model.id`` is free text; a variant id ``base[k=v,…]`` is not written).
_PLAIN_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")


def home_files(
    launch: Launch, endpoint_url: str | None, model: str | None = None
) -> dict[str, str]:
    """What the job writes into HOME: the pack's files, then (with an endpoint) the
    endpoint's in place of the same paths, then (with a ``model`` id that needs no
    quoting) ``launch.model_files`` at the start of theirs; sandbox placeholders
    expanded."""
    files = {path: expand(content) for path, content in (launch.files or {}).items()}
    if endpoint_url is not None and launch.endpoint is not None:
        for path, content in (launch.endpoint.files or {}).items():
            files[path] = expand(content).replace("{endpoint}", endpoint_url)
    if model is not None and _PLAIN_MODEL.match(model):
        for path, content in (launch.model_files or {}).items():
            files[path] = expand(content).replace("{model}", model) + files.get(path, "")
    return files


def stage_home_files(
    job_dir: Path, files: Mapping[str, str], owner: tuple[int, int]
) -> tuple[WritableMount, ...]:
    """Write ``files`` (HOME-relative, checked by the manifest) for ``owner``; the mounts
    that put them in place.

    Raises:
        SandboxError: they could not be written.
    """
    if not files:
        return ()
    root = job_dir / HOME_FILES_DIR
    try:
        _mkdir(root, owner)
        for path, content in sorted(files.items()):
            parent = root
            for part in path.split("/")[:-1]:
                parent = parent / part
                if not parent.is_dir():
                    _mkdir(parent, owner)
            fd = os.open(
                parent / path.rsplit("/", 1)[-1],
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                os.fchown(out.fileno(), *owner)
                out.write(content)
    except OSError as exc:
        raise SandboxError(
            f"the pack's files for HOME could not be written: {exc.strerror or exc}",
            path=str(root),
        ) from exc
    tops = sorted({path.split("/", 1)[0] for path in files})
    return tuple(WritableMount(root / top, f"{HOME}/{top}") for top in tops)


def _mkdir(path: Path, owner: tuple[int, int]) -> None:
    path.mkdir(mode=0o700)
    os.chown(path, *owner)
