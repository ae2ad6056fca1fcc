"""Every Redis connection of acp-worker is made here: the store's (events, state, leases,
interactions, budgets; asyncio and synchronous), the Celery broker's, ``ready``'s and the
metrics' backlog reads.

One description of the Redis (:class:`RedisTarget`) comes from a URL and the settings:

- ``redis://`` or ``rediss://`` (TLS) URLs, with redis-py's own query parameters
  (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
  ``ssl_check_hostname``) as operators write them for every redis-py and Celery program;
- ``sentinel://host:port;sentinel://host:port/DB`` (kombu's form) with
  ``ACPW_REDIS_SENTINEL_MASTER``: the master is asked of the sentinels on every
  (re)connection, so the worker follows a failover without a restart;
- TLS files (``ACPW_REDIS_TLS_CA``/``_CERT``/``_KEY``) and an ACL user
  (``ACPW_REDIS_USERNAME``, ``ACPW_REDIS_PASSWORD`` as a secret reference ``env:NAME`` or
  ``file:PATH``) from the settings; the URL's own values win over them.

Certificates and the server's name are checked unless ``ACPW_REDIS_TLS_VERIFY=false``,
which is logged as a warning every time a connection is configured with it. A URL is
printed only through :func:`redact` (no password, no secret-looking query value).
"""

from __future__ import annotations

import logging
import os
import ssl
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as asentinel
import redis.exceptions
import redis.sentinel

from worker.errors import InvalidInput, ServiceUnavailable, StoreRefused
from worker.settings import Settings

log = logging.getLogger(__name__)

#: redis-py's TLS query parameters that the store and the broker both honour.
SSL_QUERY = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_SECRET_QUERY = ("pass", "secret", "token", "key_password", "credential")
_MASK = "***"
_SCHEMES = ("redis", "rediss", "unix", "sentinel")


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where the Redis is and how to reach it (secrets resolved, never printed)."""

    url: str  # as configured, minus the TLS query parameters (credentials may be in it)
    tls: bool
    ssl: Mapping[str, Any] = field(default_factory=dict)  # redis-py ssl_* keyword arguments
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str | None = None
    db: int = 0
    sentinel_tls: bool = False
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def verified(self) -> bool:
        return not self.tls or self.ssl.get("ssl_cert_reqs", "required") != "none"

    def describe(self) -> dict[str, object]:
        """What ``ready`` says of it: no secret."""
        where: dict[str, object] = {"url": redact(self.url), "tls": self.tls}
        if self.tls:
            where["verify"] = self.verified
        if self.username:
            where["username"] = self.username
        if self.master:
            where["sentinel_master"] = self.master
            where["sentinels"] = [f"{host}:{port}" for host, port in self.sentinels]
        return where


def redact(url: str | None) -> str:
    """``url`` (or kombu's ``;``-separated list) with its password and any secret-looking
    query value replaced by ``***``; the username, host, port and database stay."""
    if not url:
        return ""
    return ";".join(_redact_one(part) for part in url.split(";"))


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, colon, _password = userinfo.partition(":")
            netloc = f"{user}:{_MASK}@{hostport}" if colon else f"{_MASK}@{hostport}"
            if colon and not user:
                netloc = f":{_MASK}@{hostport}"
        query = parse_qsl(parts.query, keep_blank_values=True)
        masked = [(k, _MASK if any(s in k.lower() for s in _SECRET_QUERY) else v) for k, v in query]
        return urlunsplit(
            (parts.scheme, netloc, parts.path, urlencode(masked, safe="/:*"), parts.fragment)
        )
    except ValueError:
        return f"{url.partition('://')[0]}://{_MASK}"


def target(
    url: str | None, settings: Settings | None = None, environ: Mapping[str, str] | None = None
) -> RedisTarget:
    """The Redis ``url`` names, with ``settings``' TLS files, ACL user and sentinel master.

    Raises:
        ServiceUnavailable: no URL.
        InvalidInput: a URL of another scheme, a sentinel URL without a master name.
        CredentialRefused: a password reference that does not resolve.
    """
    if not url:
        raise ServiceUnavailable("no Redis configured: set ACPW_REDIS_URL")
    settings = settings or Settings.model_construct()  # defaults, not the environment
    environ = os.environ if environ is None else environ
    parts = _split(url)
    scheme = parts[0].scheme
    query: dict[str, str] = {}
    for p in parts:
        query.update(dict(parse_qsl(p.query)))
    url_ssl = {k: query.pop(k) for k in SSL_QUERY if k in query}
    sentinel = scheme == "sentinel"
    db = max((int(p.path.strip("/")) for p in parts if p.path.strip("/").isdigit()), default=0)
    # Every sentinel URL names the database: kombu takes it from the URL it fails over to.
    clean = ";".join(
        urlunsplit(
            (
                p.scheme,
                p.netloc,
                f"/{db}" if sentinel else p.path,
                urlencode(list(_rest(p.query))),
                p.fragment,
            )
        )
        for p in parts
    )
    tls = scheme == "rediss" or (sentinel and (settings.redis_tls or bool(url_ssl)))
    # TLS sentinels take the same files (CA, client certificate), whether or not the
    # master is reached over TLS too.
    sentinel_tls = sentinel and settings.redis_sentinel_tls
    ssl_opts = _ssl_options(settings, url_ssl) if tls or sentinel_tls else {}
    if ssl_opts.get("ssl_cert_reqs") == "none":
        log.warning(
            "Redis TLS verification is OFF for %s (ACPW_REDIS_TLS_VERIFY=false or "
            "ssl_cert_reqs=none): the server is not authenticated",
            redact(url),
        )
    username = next((p.username for p in parts if p.username), None) or settings.redis_username
    password = next((p.password for p in parts if p.password), None)
    if password is None and settings.redis_password:
        password = _secret("ACPW_REDIS_PASSWORD", settings.redis_password, settings, environ)
    if sentinel:
        if not settings.redis_sentinel_master:
            raise InvalidInput(
                "a sentinel:// Redis URL needs the master's name: set ACPW_REDIS_SENTINEL_MASTER",
                url=redact(url),
            )
        sentinel_password = None
        if settings.redis_sentinel_password:
            sentinel_password = _secret(
                "ACPW_REDIS_SENTINEL_PASSWORD", settings.redis_sentinel_password, settings, environ
            )
        return RedisTarget(
            url=clean,
            tls=tls,
            ssl=ssl_opts,
            username=username,
            password=password,
            sentinels=tuple((p.hostname or "127.0.0.1", p.port or 26379) for p in parts),
            master=settings.redis_sentinel_master,
            db=db,
            sentinel_tls=sentinel_tls,
            sentinel_username=settings.redis_sentinel_username,
            sentinel_password=sentinel_password,
        )
    return RedisTarget(
        url=clean, tls=tls, ssl=ssl_opts, username=username, password=password, db=db
    )


def _split(url: str) -> list[SplitResult]:
    parts = [urlsplit(p) for p in url.split(";") if p]
    scheme = parts[0].scheme if parts else ""
    if any(p.scheme != scheme for p in parts) or scheme not in _SCHEMES:
        raise InvalidInput(
            f"unsupported Redis URL {redact(url)}: redis://, rediss://, unix:// or "
            "sentinel://host:port;sentinel://host:port (with ACPW_REDIS_SENTINEL_MASTER)",
            url=redact(url),
        )
    if scheme != "sentinel" and len(parts) > 1:
        raise InvalidInput(f"only sentinel:// URLs may be a list: {redact(url)}", url=redact(url))
    return parts


def _rest(query: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in parse_qsl(query) if k not in SSL_QUERY]


def _ssl_options(settings: Settings, from_url: Mapping[str, str]) -> dict[str, object]:
    opts: dict[str, object] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if settings.redis_tls_ca is not None:
        opts["ssl_ca_certs"] = str(settings.redis_tls_ca)
    if settings.redis_tls_cert is not None:
        opts["ssl_certfile"] = str(settings.redis_tls_cert)
    if settings.redis_tls_key is not None:
        opts["ssl_keyfile"] = str(settings.redis_tls_key)
    if not settings.redis_tls_verify:
        opts.update(ssl_cert_reqs="none", ssl_check_hostname=False)
    for key, value in from_url.items():
        if key == "ssl_check_hostname":
            opts[key] = value.lower() not in ("false", "0", "no", "off")
        elif key == "ssl_cert_reqs":
            reqs = value.lower().removeprefix("cert_")
            if reqs not in ("none", "optional", "required"):
                raise InvalidInput(f"ssl_cert_reqs={value!r}: none, optional or required")
            opts[key] = reqs
            if reqs == "none":
                opts["ssl_check_hostname"] = False
        else:
            opts[key] = value
    return opts


def _secret(setting: str, ref: str, settings: Settings, environ: Mapping[str, str]) -> str:
    from worker.credentials.resolve import secret_sources

    sources = secret_sources(settings, environ)
    sources.check(setting, ref)
    return sources.resolve(setting, ref)


def _conn_kwargs(t: RedisTarget, **timeouts: Any) -> dict[str, Any]:
    kwargs: dict[str, object] = dict(timeouts)
    if t.username:
        kwargs["username"] = t.username
    if t.password is not None:
        kwargs["password"] = t.password
    return kwargs


def _sentinel_kwargs(t: RedisTarget, **timeouts: Any) -> dict[str, Any]:
    kwargs: dict[str, object] = dict(timeouts)
    if t.sentinel_username:
        kwargs["username"] = t.sentinel_username
    if t.sentinel_password is not None:
        kwargs["password"] = t.sentinel_password
    if t.sentinel_tls:
        kwargs.update(ssl=True, **t.ssl)
    return kwargs


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    """How many replicas must acknowledge a write that must survive a failover, and for
    how long the worker waits for them (``WAIT replicas ms``)."""

    replicas: int
    ms: int


_policies: weakref.WeakKeyDictionary[Any, WaitPolicy] = weakref.WeakKeyDictionary()


def wait_policy(t: RedisTarget, settings: Settings | None) -> WaitPolicy:
    replicas = settings.redis_wait_replicas if settings is not None else None
    if replicas is None:
        replicas = 1 if t.master else 0
    return WaitPolicy(replicas, settings.redis_wait_ms if settings is not None else 1000)


async def replicated(client: aioredis.Redis, what: str) -> int | None:
    """``WAIT`` for the replicas ``client``'s policy asks for, bounded; None without a
    policy. Fewer replicas than asked is logged, never raised: the write stands on the
    master, and a failover before a replica has it may still undo it (docs/durability.md,
    What a failover does)."""
    policy = _policies.get(client)
    if policy is None or policy.replicas <= 0:
        return None
    try:
        acked = int(await client.execute_command("WAIT", policy.replicas, policy.ms))  # type: ignore[no-untyped-call]
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        log.warning("%s: could not wait for a replica: %s", what, exc)
        return None
    return _acknowledged(acked, policy, what)


def _acknowledged(acked: int, policy: WaitPolicy, what: str) -> int:
    if acked < policy.replicas:
        log.warning(
            "%s: %d of %d replicas acknowledged within %d ms",
            what,
            acked,
            policy.replicas,
            policy.ms,
        )
    return acked


def replicated_sync(client: redis.Redis, what: str, *, strict: bool = False) -> int | None:
    """:func:`replicated` for a synchronous client (the control plane's submit and
    cancel); with ``strict``, a Redis that cannot be asked is raised: whether the write
    reached a replica is then unknown."""
    policy = _policies.get(client)
    if policy is None or policy.replicas <= 0:
        return None
    try:
        acked = int(client.execute_command("WAIT", policy.replicas, policy.ms))  # type: ignore[no-untyped-call]
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        if strict:
            raise
        log.warning("%s: could not wait for a replica: %s", what, exc)
        return None
    return _acknowledged(acked, policy, what)


def sync_client(t: RedisTarget, settings: Settings | None = None, **timeouts: Any) -> redis.Redis:
    """A synchronous client of ``t`` (``timeouts``: redis-py's socket_* arguments); with
    ``settings``, its writes that must survive a failover wait for the replicas they ask
    for (:func:`replicated_sync`)."""
    client = _sync_client(t, **timeouts)
    if settings is not None:
        _policies[client] = wait_policy(t, settings)
    return client


def _sync_client(t: RedisTarget, **timeouts: Any) -> redis.Redis:
    kwargs = _conn_kwargs(t, **timeouts)
    if t.master:
        manager = redis.sentinel.Sentinel(
            list(t.sentinels), sentinel_kwargs=_sentinel_kwargs(t, **timeouts), **kwargs
        )
        extra: dict[str, Any] = {}
        if t.tls:
            extra = {"connection_class": redis.sentinel.SentinelManagedSSLConnection, **t.ssl}
        client: redis.Redis = manager.master_for(t.master, db=t.db, **extra)
        return client
    return redis.Redis.from_url(t.url, **t.ssl, **kwargs)


def async_client(
    t: RedisTarget, settings: Settings | None = None, **timeouts: Any
) -> aioredis.Redis:
    """An asyncio client of ``t``; its writes that must survive a failover wait for the
    replicas ``settings`` ask for (:func:`replicated`)."""
    client = _async_client(t, **timeouts)
    _policies[client] = wait_policy(t, settings)
    return client


def _async_client(t: RedisTarget, **timeouts: Any) -> aioredis.Redis:
    kwargs = _conn_kwargs(t, **timeouts)
    if t.master:
        manager = asentinel.Sentinel(
            list(t.sentinels), sentinel_kwargs=_sentinel_kwargs(t, **timeouts), **kwargs
        )
        extra: dict[str, Any] = {}
        if t.tls:
            extra = {"connection_class": asentinel.SentinelManagedSSLConnection, **t.ssl}
        client: aioredis.Redis = manager.master_for(t.master, db=t.db, **extra)
        return client
    return aioredis.Redis.from_url(t.url, **t.ssl, **kwargs)


def broker_options(t: RedisTarget) -> dict[str, Any]:
    """The Celery settings that connect to ``t`` as the broker: ``broker_url`` (its TLS
    query parameters moved to ``broker_use_ssl``, which kombu would otherwise fill with
    ``CERT_NONE`` for a ``rediss://`` URL without them), the ACL user, the sentinel master."""
    opts: dict[str, object] = {"broker_url": _with_user(t)}
    if t.tls:
        reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL}
        opts["broker_use_ssl"] = {
            **t.ssl,
            "ssl_cert_reqs": reqs.get(str(t.ssl.get("ssl_cert_reqs")), ssl.CERT_REQUIRED),
        }
    transport: dict[str, object] = {}
    if t.master:
        transport["master_name"] = t.master
        sentinel_kwargs = _sentinel_kwargs(t)
        if sentinel_kwargs:
            transport["sentinel_kwargs"] = sentinel_kwargs
    opts["broker_transport_options"] = transport
    return opts


def _with_user(t: RedisTarget) -> str:
    """``t``'s URL with its ACL user in every part: kombu reconnects to the next URL of a
    list (a failover) with that URL's own credentials only, not ``broker_user``'s."""
    if not t.username and t.password is None:
        return t.url
    userinfo = quote(t.username or "", safe="")
    if t.password is not None:
        userinfo += ":" + quote(t.password, safe="")
    parts = []
    for part in t.url.split(";"):
        split = urlsplit(part)
        if "@" not in split.netloc:
            split = split._replace(netloc=f"{userinfo}@{split.netloc}")
        parts.append(urlunsplit(split))
    return ";".join(parts)


def refused(exc: BaseException, t: RedisTarget | None = None) -> ServiceUnavailable:
    """A Redis error as the typed error a person can act on: a TLS or ACL refusal is
    ``redis_refused`` (``reason``: ``certificate_unverified``, ``server_name_mismatch``,
    ``tls_failed``, ``auth_failed``, ``not_permitted``); anything else ``service_unavailable``.
    The message names the Redis by its redacted URL only."""
    where = redact(t.url) if t is not None else "Redis"
    text = _chain_text(exc)
    reason = None
    if "certificate verify failed" in text or "CERTIFICATE_VERIFY_FAILED" in text:
        if "mismatch" in text or "doesn't match" in text:
            reason = "server_name_mismatch"
        else:
            reason = "certificate_unverified"
    elif "SSL" in text or "TLS" in text or "wrong version number" in text:
        reason = "tls_failed"
    elif isinstance(exc, redis.exceptions.AuthenticationError) or "WRONGPASS" in text:
        reason = "auth_failed"
    elif isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        reason = "not_permitted"
    if reason is None:
        return ServiceUnavailable(f"{where} did not answer: {exc}")
    messages = {
        "certificate_unverified": "its certificate is not signed by a trusted CA "
        "(ACPW_REDIS_TLS_CA or ssl_ca_certs)",
        "server_name_mismatch": "its certificate does not name the host connected to",
        "tls_failed": "the TLS handshake failed",
        "auth_failed": "the username or password was refused",
        "not_permitted": "the ACL user may not run a command the worker needs "
        "(docs/durability.md, An operator's ACL)",
    }
    return StoreRefused(f"{where} refused the connection: {messages[reason]}: {exc}", reason=reason)


def _chain_text(exc: BaseException) -> str:
    seen: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 8:
        seen.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " | ".join(seen)
