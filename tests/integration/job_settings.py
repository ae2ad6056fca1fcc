"""The ``Settings`` of a worker run in process by an integration test: every directory of
its own under the test's ``tmp_path``, the suite's Redis, short shutdown graces (an agent
that ignores EOF or SIGTERM is not waited for long), and the test's own overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import REDIS_URL
from worker.settings import Settings


def job_settings(tmp_path: Path, worker_id: str, **overrides: Any) -> Settings:
    """``Settings`` for a worker ``worker_id`` whose cache, work, results, sessions and
    secrets directories are below ``tmp_path``; ``overrides`` win."""
    fields: dict[str, Any] = {
        "redis_url": REDIS_URL,
        "cache_dir": tmp_path / "cache",
        "work_dir": tmp_path / "work",
        "results_dir": tmp_path / "results",
        "session_dir": tmp_path / "sessions",
        "secrets_dir": tmp_path / "secrets",
        "worker_id": worker_id,
        "shutdown_eof_grace": 1.0,
        "shutdown_term_grace": 1.0,
    }
    return Settings(**(fields | overrides))
