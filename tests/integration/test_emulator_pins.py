"""The emulator pack's pins match its source: a rebuild gives the locked archive bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "provider_packs" / "cursor-emulator"


def test_rebuilt_archive_matches_pack_json(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(PACK / "build.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    [archive] = tmp_path.glob("*.tar")
    pin = json.loads((PACK / "pack.json").read_text())["platforms"]["any"]["archive"]
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert digest == pin["sha256"], "emulator source changed: run `make lock-packs` and commit"
    assert archive.stat().st_size == pin["size"]
