"""Packs folders whose ``cursor-emulator`` runs another program: one that allocates far past
any small memory bound, or a test's own ACP peer (``emulator_variant``).

The emulator's closure and lock are reused as they are (so a pack image built for the
emulator serves it too); only ``launch`` changes. The hungry one: python fills 400 MiB before it
says a word of ACP, so a job with ``limits.memory_mb`` 64 has its agent OOM-killed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ALLOCATE = "b = bytearray(400 << 20); print('survived', flush=True)"


def hungry_packs(dest: Path) -> Path:
    """``dest/packs`` holding the hungry ``cursor-emulator``; returns that folder."""
    return emulator_variant(dest, argv=["/usr/bin/python3", "-c", ALLOCATE])


def emulator_variant(dest: Path, **launch: Any) -> Path:
    """``dest/packs`` holding a ``cursor-emulator`` whose ``launch`` has ``launch``'s
    entries in place of its own (an ACP dialect pack, the emulator's closure and lock)."""
    packs = dest / "packs"
    source = REPO / "provider_packs" / "cursor-emulator"
    shutil.copytree(source, packs / "cursor-emulator", ignore=shutil.ignore_patterns("src"))
    path = packs / "cursor-emulator" / "pack.json"
    data = json.loads(path.read_text())
    data["launch"].update(launch)
    data["launch"] = {k: v for k, v in data["launch"].items() if v is not None}
    data["dialect"] = "acp"  # not Cursor's launch: the cursor launch contract would refuse it
    path.write_text(json.dumps(data))
    return packs
