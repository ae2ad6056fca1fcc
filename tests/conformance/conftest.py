"""Real third-party ACP agents from their locked npm packs (see ``agents.py``).

The packs' archives are rebuilt from the committed npm locks once per session
(``acp-worker pack build-npm``: a no-op when ``dist/`` already holds the pinned bytes,
otherwise ``npm ci`` from the npm registry and a byte-for-byte check against the pin).
One closure cache serves the whole session, so each closure is extracted once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.agents import AGENTS, REPO


@pytest.fixture(scope="session")
def npm_packs() -> None:
    for agent in AGENTS:
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", "pack", "build-npm", agent.pack],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=900,
        )
        assert done.returncode == 0, f"building pack {agent.pack}: {done.stderr}"


@pytest.fixture(scope="session")
def closure_cache(tmp_path_factory: pytest.TempPathFactory, npm_packs: None) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("conformance-cache")
    yield cache
    # ~850 MB of extracted closures: not left for pytest's tmp retention to keep around.
    subprocess.run(["chmod", "-R", "u+w", str(cache)], check=False)
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture
def worker_env(tmp_path: Path, closure_cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env.update(
        {
            "ACPW_CACHE_DIR": str(closure_cache),
            "ACPW_WORK_DIR": str(tmp_path / "work"),
            "ACPW_SHUTDOWN_EOF_GRACE": "1",
            "ACPW_SHUTDOWN_TERM_GRACE": "1",
            "ACPW_CANCEL_GRACE": "3",
        }
    )
    return env
