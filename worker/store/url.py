"""Which Redis a command talks to when nothing names one.

``serve``, ``reap``, ``submit``, ``events``, ``status``, ``cancel``, ``answer`` and
``interactions`` use ``redis://127.0.0.1:6379/0`` when neither ``--redis`` nor
``ACPW_REDIS_URL`` names a Redis, as redis-py and Celery's Redis transport default to
the local server, and say so on stderr. ``run`` does not (without a Redis it runs the job
with no state at all), nor does ``ready``: a health check with nothing configured must
fail. The Celery broker defaults to the same URL (``worker.client.queue.broker_url``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True, slots=True)
class RedisChoice:
    """The URL to use, and whether it is the default (nothing was configured)."""

    url: str
    defaulted: bool

    @property
    def notice(self) -> str | None:
        """The line that says a default was taken (None when one was configured)."""
        if not self.defaulted:
            return None
        return f"acp-worker: using Redis at {self.url} (the default: set --redis or ACPW_REDIS_URL)"


def choose_redis(*candidates: str | None) -> RedisChoice:
    """The first URL given among ``candidates`` (a flag, then the settings), or the default."""
    for url in candidates:
        if url:
            return RedisChoice(url, defaulted=False)
    return RedisChoice(DEFAULT_REDIS_URL, defaulted=True)
