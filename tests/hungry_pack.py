"""A packs folder whose ``cursor-emulator`` allocates far past any small memory bound.

The emulator's closure and lock are reused as they are (so a pack image built for the
emulator serves it too); only ``launch.argv`` changes: python fills 400 MiB before it
says a word of ACP, so a job with ``limits.memory_mb`` 64 has its agent OOM-killed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOCATE = "b = bytearray(400 << 20); print('survived', flush=True)"


def hungry_packs(dest: Path) -> Path:
    """``dest/packs`` holding the hungry ``cursor-emulator``; returns that folder."""
    packs = dest / "packs"
    source = REPO / "provider_packs" / "cursor-emulator"
    shutil.copytree(source, packs / "cursor-emulator", ignore=shutil.ignore_patterns("src"))
    path = packs / "cursor-emulator" / "pack.json"
    data = json.loads(path.read_text())
    data["launch"]["argv"] = ["/usr/bin/python3", "-c", ALLOCATE]
    data["dialect"] = "acp"  # not Cursor's launch: the cursor launch contract would refuse it
    path.write_text(json.dumps(data))
    return packs
