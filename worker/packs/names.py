"""Names a pack may use: pack names, platforms and closure-relative file paths.

Closure-relative paths are checked by :func:`worker.safetree.path_problem`, the check the
extractor applies too, so a path that can be locked is exactly a path that can be
extracted; it is re-exported here for the manifest and the lock file.
"""

from __future__ import annotations

import platform as _platform
import re
import sys
from typing import Final, Literal, get_args

from worker.errors import InvalidInput, PlatformUnsupported
from worker.safetree.names import MAX_COMPONENT_BYTES, MAX_PATH_BYTES, path_problem

Platform = Literal["linux-x64", "linux-arm64", "any"]
PLATFORMS: Final[tuple[Platform, ...]] = get_args(Platform)
ANY: Final[Platform] = "any"

PACK_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
SHA256_HEX: Final = r"^[0-9a-f]{64}$"
CLOSURE_DIGEST: Final = r"^sha256:[0-9a-f]{64}$"

_MACHINES: Final[dict[str, Platform]] = {
    "x86_64": "linux-x64",
    "amd64": "linux-x64",
    "aarch64": "linux-arm64",
    "arm64": "linux-arm64",
}


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


__all__ = [
    "ANY",
    "CLOSURE_DIGEST",
    "MAX_COMPONENT_BYTES",
    "MAX_PATH_BYTES",
    "PACK_NAME_RE",
    "PLATFORMS",
    "SHA256_HEX",
    "Platform",
    "check_pack_name",
    "check_platform",
    "current_platform",
    "path_problem",
]
