"""Daytona's SDK at the seam: a client per sandbox or operation, every call retried through
tenacity while Daytona answers 429 or a transient 5xx, and every SDK exception translated
into the error tree (``translate``) with the API key scrubbed from what is kept.

    DaytonaAuthenticationError, 403 (not quota)    → BackendAuthFailed     backend_auth_failed
    an answer that names a quota or a limit hit    → BackendQuotaExceeded  backend_quota_exceeded
    DaytonaRateLimitError after every retry        → BackendRateLimited    backend_rate_limited
    DaytonaTimeoutError while creating a sandbox   → SandboxStartTimeout   sandbox_start_timeout
    any other DaytonaError                         → SandboxError          sandbox_failed
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, NoReturn, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from worker.errors import (
    BackendAuthFailed,
    BackendQuotaExceeded,
    BackendRateLimited,
    SandboxError,
    SandboxStartTimeout,
)
from worker.sandbox.daytona import sdk

if TYPE_CHECKING:
    from daytona import AsyncDaytona, DaytonaError

    from worker.sandbox.config import DaytonaConfig

T = TypeVar("T")
_TRANSIENT = frozenset({429, 502, 503, 504})
#: What Daytona's answers say when an organisation's limit refuses a request: a 400
#: "Total CPU limit exceeded. Maximum allowed: N." (memory, disk alike), "Sandbox
#: resource limit reached (N)", or a message naming a quota.
_QUOTA_MARKERS = ("quota", "limit exceeded", "resource limit reached")

#: event loop → (API URL, key digest) → the bound on calls in flight to that
#: organisation from this process, shared by every backend and job using it.
_BOUNDS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, str, int], asyncio.Semaphore]
] = weakref.WeakKeyDictionary()


def _bound(url: str, key: str, size: int) -> asyncio.Semaphore:
    bounds = _BOUNDS.setdefault(asyncio.get_running_loop(), {})
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return bounds.setdefault((url, digest, size), asyncio.Semaphore(size))


def _transient(exc: BaseException) -> bool:
    d = sdk.module()
    return isinstance(exc, d.DaytonaError) and (
        isinstance(exc, d.DaytonaRateLimitError) or exc.status_code in _TRANSIENT
    )


def _retry_after(exc: BaseException | None) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), "")
    try:
        return min(max(float(value), 0.0), 30.0)
    except (TypeError, ValueError):
        return None


class Api:
    """Access to Daytona for one backend: the key, fresh SDK clients (each owns an
    aiohttp session of the loop it was made in: a sandbox keeps its own until it is
    destroyed, every other operation closes its client when done), retries and
    translation."""

    def __init__(self, config: DaytonaConfig) -> None:
        self.config = config
        self._key: str | None = None

    def key(self) -> str:
        """The API key (read once).

        Raises:
            BackendAuthFailed: no key is configured or its file cannot be read.
        """
        if self._key is None:
            try:
                self._key = self.config.api_key()
            except OSError as exc:
                raise BackendAuthFailed(
                    "the Daytona API key file cannot be read",
                    path=str(self.config.daytona_api_key_file),
                ) from exc
            if not self._key:
                raise BackendAuthFailed(
                    "no Daytona API key: set ACPW_DAYTONA_API_KEY or ACPW_DAYTONA_API_KEY_FILE"
                )
        return self._key

    def new_client(self) -> AsyncDaytona:
        """A new SDK client (close it with :func:`close_client`).

        Raises:
            BackendAuthFailed: no API key.
            SandboxError: the SDK refused its configuration.
        """
        d = sdk.module()
        config = d.DaytonaConfig(
            api_key=self.key(),
            api_url=self.config.daytona_api_url,
            target=self.config.daytona_target,
        )
        with self.translating("connect"):
            client: AsyncDaytona = d.AsyncDaytona(config)
        return client

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncDaytona]:
        """A client for the body, closed after it."""
        client = self.new_client()
        try:
            yield client
        finally:
            await close_client(client)

    async def call(
        self,
        what: str,
        fn: Callable[[], Awaitable[T]],
        *,
        bounded: bool = True,
        **context: object,
    ) -> T:
        """``await fn()``, retried while Daytona answers 429/502/503/504 (its
        ``Retry-After`` honoured, else exponential back-off), translated at the end; at
        most ``daytona_max_concurrent_calls`` such calls to one organisation are in
        flight from this process at once (the others wait their turn); ``bounded=False``
        for a stream that lasts as long as a command runs (its log), which would
        otherwise hold a place for the whole job.

        Raises:
            SandboxError: (or a subclass) what the last attempt raised, translated.
        """
        attempts = AsyncRetrying(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(self.config.daytona_retry_attempts),
            wait=_wait,
            reraise=True,
        )
        bound = _bound(
            self.config.daytona_api_url, self.key(), self.config.daytona_max_concurrent_calls
        )
        with self.translating(what, **context):
            async for attempt in attempts:
                with attempt:
                    if not bounded:  # a stream that lasts the command's run
                        return await fn()
                    async with bound:  # the back-off waits outside it
                        return await fn()
        raise AssertionError("unreachable: tenacity re-raises the last error")

    @contextlib.contextmanager
    def translating(self, what: str, **context: object) -> Iterator[None]:
        """Translate what the SDK raises inside into the error tree.

        Raises:
            SandboxError: (or a subclass) for any ``DaytonaError``.
        """
        try:
            yield
        except Exception as exc:
            if sdk.loaded() and isinstance(exc, sdk.module().DaytonaError):
                translate(exc, what, secret=self._key, **context)
            raise


async def close_client(client: AsyncDaytona) -> None:
    """Close a client's HTTP session; never raises (a failed close leaks nothing more)."""
    with contextlib.suppress(Exception):
        await client.close()  # type: ignore[no-untyped-call]


def _wait(retry_state: object) -> float:
    outcome = getattr(retry_state, "outcome", None)
    exc = outcome.exception() if outcome is not None else None
    after = _retry_after(exc)
    if after is not None:
        return after
    return float(wait_exponential(multiplier=0.5, max=8)(retry_state))  # type: ignore[arg-type]


def scrub(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (the API key) replaced: it never reaches an error."""
    return text.replace(secret, "***") if secret else text


def translate(exc: DaytonaError, what: str, *, secret: str | None, **context: object) -> NoReturn:
    """Raise the error-tree exception for ``exc`` (always raises).

    Raises:
        SandboxError: or the subclass the answer calls for (module docstring).
    """
    # Not chained (``from None``): the SDK's exception carries whole response bodies and
    # headers, and a logged traceback would print them; the scrubbed message, the status
    # and the operation are what is kept.
    message = scrub(str(exc), secret)
    details = {"operation": what, "status": exc.status_code, **context}
    text = f"daytona: {what} failed: {message}"
    if any(marker in message.lower() for marker in _QUOTA_MARKERS):
        raise BackendQuotaExceeded(text, **details) from None
    d = sdk.module()
    if isinstance(exc, d.DaytonaAuthenticationError | d.DaytonaForbiddenError):
        raise BackendAuthFailed(text, **details) from None
    if isinstance(exc, d.DaytonaRateLimitError):
        raise BackendRateLimited(text, **details) from None
    if isinstance(exc, d.DaytonaTimeoutError) and what == "create sandbox":
        raise SandboxStartTimeout(text, **details) from None
    raise SandboxError(text, **details) from None
