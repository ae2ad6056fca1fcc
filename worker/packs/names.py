"""Names a pack may use: pack names, platforms and closure-relative file paths.

These checks are shared by the manifest, the lock file and the extractor, so a path that
can be locked is exactly a path that can be extracted.
"""

from __future__ import annotations

import platform as _platform
import re
import sys
from typing import Final, Literal, get_args

from worker.errors import InvalidInput, PlatformUnsupported

Platform = Literal["linux-x64", "linux-arm64", "any"]
PLATFORMS: Final[tuple[Platform, ...]] = get_args(Platform)
ANY: Final[Platform] = "any"

PACK_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
SHA256_HEX: Final = r"^[0-9a-f]{64}$"
CLOSURE_DIGEST: Final = r"^sha256:[0-9a-f]{64}$"
MAX_PATH_BYTES: Final = 1024
MAX_COMPONENT_BYTES: Final = 255

_MACHINES: Final[dict[str, Platform]] = {
    "x86_64": "linux-x64",
    "amd64": "linux-x64",
    "aarch64": "linux-arm64",
    "arm64": "linux-arm64",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def current_platform(*, machine: str | None = None, system: str | None = None) -> Platform:
    """This host's platform; raises PlatformUnsupported off Linux or on other CPUs."""
    machine = (machine if machine is not None else _platform.machine()).lower()
    system = system if system is not None else sys.platform
    found = _MACHINES.get(machine)
    if found is None or not system.startswith("linux"):
        raise PlatformUnsupported(
            f"no pack platform for {system}/{machine}", machine=machine, system=system
        )
    return found


def check_platform(value: str) -> Platform:
    """*value* as a Platform; raises InvalidInput for anything else."""
    if value not in PLATFORMS:
        raise InvalidInput(
            f"unknown platform {value!r} (expected one of {', '.join(PLATFORMS)})",
            field="platform",
            value=value,
        )
    return value


def check_pack_name(name: str) -> str:
    """*name* if it is a valid pack folder name; raises InvalidInput otherwise."""
    if not PACK_NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid pack name {name!r} (lowercase letters, digits, '.', '_', '-')",
            field="name",
            value=name,
        )
    return name


def path_problem(path: str) -> str | None:
    """Why *path* is not a canonical closure path, or None when it is one.

    Canonical: relative POSIX, valid UTF-8, no empty, ``.`` or ``..`` component, no
    control character (so no NUL or newline), components at most 255 bytes and the
    whole at most 1024 bytes.
    """
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if not path:
        return "empty name"
    if path.startswith("/"):
        return "absolute path"
    if _CONTROL.search(path):
        return "control character in name"
    if len(raw) > MAX_PATH_BYTES:
        return f"name longer than {MAX_PATH_BYTES} bytes"
    return _component_problem(path.split("/"))


def _component_problem(parts: list[str]) -> str | None:
    for part in parts:
        if part == "..":
            return "'..' component"
        if part in ("", "."):
            return "empty or '.' component"
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return f"component longer than {MAX_COMPONENT_BYTES} bytes"
    return None
