"""Secret sources: where the value of a credential reference comes from, one per scheme.

A job names a credential and a reference ``<scheme>:<where>``, never the value. Each
scheme is served by a :class:`SecretSource`; which schemes exist and which an operator
allows are kept apart:

    SecretRegistry                 scheme -> factory: the built-ins (``env``, ``file``),
      │                            ``register()``, and entry points of the group
      │                            ``acp_worker.secret_sources`` (name = scheme, object =
      │                            a factory taking a SourceContext)
      └─ .for_job(context, enabled) -> SecretSources
                                   one job's view: only the operator's enabled schemes
                                   (``ACPW_SECRET_SOURCES``), sources built on first use

Every failure is a :class:`~worker.errors.CredentialRefused` with a ``reason``; no
message or detail ever carries a resolved value. A third-party source that raises
anything else is refused as ``source_failed`` with only the exception's type named,
since its message could hold what it read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Protocol

from worker.errors import CredentialRefused, InvalidInput

if TYPE_CHECKING:
    from worker.settings import Settings

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "acp_worker.secret_sources"
#: The largest value any source may return (UTF-8 bytes).
MAX_SECRET_BYTES = 64 * 1024
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]{0,31}$")


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source may use: the worker's settings and environment (for ``env:``, and for
    a third-party source's own configuration, since settings forbid unknown fields)."""

    settings: Settings
    environ: Mapping[str, str]


class SecretSource(Protocol):
    """Resolves the references of one scheme."""

    scheme: str

    def resolve(self, where: str, *, name: str) -> str:
        """The value of ``<scheme>:<where>``, bound to credential ``name``.

        Raises:
            CredentialRefused: the reference is malformed or does not resolve; the
                message and details never contain the value.
        """
        ...


SourceFactory = Callable[[SourceContext], SecretSource]


def split_reference(ref: str) -> tuple[str, str]:
    """``(scheme, where)`` of a reference (scheme empty when there is none)."""
    scheme, sep, where = ref.partition(":")
    return (scheme, where) if sep and SCHEME.match(scheme) else ("", ref)


class SecretRegistry:
    """Source factories by scheme; first registration of a scheme wins."""

    def __init__(self, factories: Mapping[str, SourceFactory] | None = None) -> None:
        self._factories: dict[str, SourceFactory | EntryPoint] = {}
        for scheme, factory in (factories or {}).items():
            self.register(scheme, factory)

    def register(self, scheme: str, factory: SourceFactory) -> None:
        """Add a source for ``scheme``.

        Raises:
            InvalidInput: the scheme is malformed or already registered.
        """
        if not SCHEME.match(scheme):
            raise InvalidInput(f"secret source scheme {scheme!r} must match {SCHEME.pattern}")
        if scheme in self._factories:
            raise InvalidInput(f"secret source scheme {scheme!r} is already registered")
        self._factories[scheme] = factory

    def discover(self, group: str = ENTRY_POINT_GROUP) -> tuple[str, ...]:
        """Register the installed entry points of ``group`` (loaded on first use); a
        malformed or already registered name is skipped with a warning. Returns the
        schemes added."""
        added = []
        for point in entry_points(group=group):
            if not SCHEME.match(point.name) or point.name in self._factories:
                log.warning("secret source entry point %r (%s) skipped", point.name, point.value)
                continue
            self._factories[point.name] = point
            added.append(point.name)
        return tuple(added)

    def for_job(self, context: SourceContext, enabled: Sequence[str]) -> SecretSources:
        """The sources of ``enabled`` schemes that are registered, for one job."""
        factories = {s: self._factories[s] for s in enabled if s in self._factories}
        return SecretSources(context, factories)


class SecretSources:
    """One job's enabled sources; each is built on first use and then reused."""

    def __init__(
        self, context: SourceContext, factories: Mapping[str, SourceFactory | EntryPoint]
    ) -> None:
        self._context = context
        self._factories = dict(factories)
        self._built: dict[str, SecretSource] = {}

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(sorted(self._factories))

    def check(self, name: str, ref: str) -> None:
        """Refuse a reference whose scheme is not enabled, before anything is looked up.

        Raises:
            CredentialRefused: reason ``unknown_source``.
        """
        scheme, _ = split_reference(ref)
        if scheme not in self._factories:
            # The scheme is not echoed: a secret pasted as a reference could start with it.
            raise CredentialRefused(
                f"credential {name}: its reference names a secret source that is not "
                f"enabled on this worker (enabled: {', '.join(self.enabled) or 'none'})",
                name=name,
                reason="unknown_source",
                enabled=list(self.enabled),
            )

    def resolve(self, name: str, ref: str) -> str:
        """The value of ``ref``, checked to be non-empty text of at most 64 KiB.

        Raises:
            CredentialRefused: not enabled (``unknown_source``), the source could not be
                loaded (``source_unavailable``) or failed (``source_failed``), or its own
                reason.
        """
        self.check(name, ref)
        scheme, where = split_reference(ref)
        source = self._source(scheme, name)
        try:
            value = source.resolve(where, name=name)
        except CredentialRefused:
            raise
        except Exception as exc:  # a third-party source: its message may hold the value
            raise CredentialRefused(
                f"credential {name}: the {scheme} source failed ({type(exc).__name__})",
                name=name,
                reason="source_failed",
            ) from None
        return checked_value(value, name=name, scheme=scheme)

    def _source(self, scheme: str, name: str) -> SecretSource:
        if scheme not in self._built:
            self._built[scheme] = self._build(scheme, name)
        return self._built[scheme]

    def _build(self, scheme: str, name: str) -> SecretSource:
        factory = self._factories[scheme]
        try:
            if isinstance(factory, EntryPoint):
                factory = factory.load()
            return factory(self._context)
        except CredentialRefused:
            raise
        except Exception as exc:
            raise CredentialRefused(
                f"credential {name}: the {scheme} secret source cannot be loaded "
                f"({type(exc).__name__}: {exc})",
                name=name,
                reason="source_unavailable",
            ) from None


def checked_value(value: object, *, name: str, scheme: str) -> str:
    """``value`` if it is non-empty text of at most :data:`MAX_SECRET_BYTES`.

    Raises:
        CredentialRefused: reason ``unresolved`` (empty or not text) or ``too_large``.
    """
    if not isinstance(value, str) or not value:
        raise CredentialRefused(
            f"credential {name}: the {scheme} source gave no text value",
            name=name,
            reason="unresolved",
        )
    if len(value.encode("utf-8", "surrogatepass")) > MAX_SECRET_BYTES:
        raise CredentialRefused(
            f"credential {name}: its value is larger than {MAX_SECRET_BYTES} bytes",
            name=name,
            reason="too_large",
        )
    return value
