"""Resolving a job's credential references into values, only for names the pack allows.

A job never carries a secret: it names a credential and says where the worker finds it,
as ``<scheme>:<where>`` (``env:NAME``, ``file:PATH``, or a pluggable source such as
``aws-sm:<secret-id>[#<json-key>]``; see :mod:`worker.credentials.sources`). Anything
missing, unknown to the pack, naming a source the operator did not enable, or
unresolvable refuses the job with ``credential_refused`` before anything starts. The
refusal never contains the value.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from worker.credentials.builtin import EnvSource, FileSource
from worker.credentials.redact import Redactor
from worker.credentials.sources import (
    MAX_SECRET_BYTES,
    SecretRegistry,
    SecretSource,
    SecretSources,
    SourceContext,
    SourceFactory,
)
from worker.errors import CredentialRefused

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["MAX_SECRET_BYTES", "default_registry", "resolve_credentials", "secret_sources"]


def _aws_sm(context: SourceContext) -> SecretSource:
    from worker.credentials.aws_sm import AwsSecretsManager  # boto3 is an optional extra

    return AwsSecretsManager(context)


#: The sources acp-worker ships; only those in ``ACPW_SECRET_SOURCES`` are used.
SHIPPED: Mapping[str, SourceFactory] = {"env": EnvSource, "file": FileSource, "aws-sm": _aws_sm}


@functools.cache
def default_registry() -> SecretRegistry:
    """The shipped sources plus every installed ``acp_worker.secret_sources`` entry point
    (discovered once per process; a shipped scheme cannot be taken over)."""
    registry = SecretRegistry(SHIPPED)
    registry.discover()
    return registry


def secret_sources(
    settings: Settings,
    environ: Mapping[str, str],
    registry: SecretRegistry | None = None,
) -> SecretSources:
    """One job's sources: the schemes of ``settings.secret_sources`` that are installed."""
    context = SourceContext(settings=settings, environ=environ)
    return (registry or default_registry()).for_job(context, settings.secret_sources)


def resolve_credentials(
    refs: Mapping[str, str],
    *,
    allowed: Sequence[str],
    sources: SecretSources,
    redactor: Redactor,
) -> dict[str, str]:
    """Values for ``refs``; every value is registered with ``redactor`` before returning.

    Every name and every reference's source is checked before any source is asked, so a
    job refused for one credential never makes another source look anything up.

    Raises:
        CredentialRefused: a name the pack does not accept (``not_allowed``), a source not
            enabled (``unknown_source``), or a reference that does not resolve (the
            source's reason: ``unresolved``, ``outside_secrets_dir``, ``not_found``, …).
    """
    for name, ref in refs.items():
        if name not in allowed:
            raise CredentialRefused(
                f"credential {name} is not accepted by this pack",
                name=name,
                reason="not_allowed",
                allowed=list(allowed),
            )
        sources.check(name, ref)
    values: dict[str, str] = {}
    for name, ref in refs.items():
        value = sources.resolve(name, ref)
        redactor.register(value)
        values[name] = value
    return values
