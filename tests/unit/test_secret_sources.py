"""The secret source registry: pluggable schemes, enabled by the operator, refused otherwise."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from worker.credentials import aws_sm
from worker.credentials.redact import MASK, Redactor
from worker.credentials.resolve import SHIPPED, resolve_credentials
from worker.credentials.sources import (
    MAX_SECRET_BYTES,
    SecretRegistry,
    SecretSource,
    SourceContext,
    split_reference,
)
from worker.errors import CredentialRefused, InvalidInput, InvalidJobSpec
from worker.jobs.spec import parse_job
from worker.settings import Settings

ALLOWED = ["CURSOR_API_KEY", "CURSOR_AUTH_TOKEN"]
VALUE = "vault-value-5e1f0a"


class VaultSource:
    """An in-test source: ``vault:<path>`` answers from a dict and counts lookups."""

    scheme = "vault"
    calls: list[str]

    def __init__(self, context: SourceContext, answers: dict[str, Any] | None = None) -> None:
        self.context = context
        self.answers = {"kv/cursor": VALUE} if answers is None else answers
        self.calls = []

    def resolve(self, where: str, *, name: str) -> str:
        self.calls.append(where)
        if where not in self.answers:
            raise CredentialRefused(f"credential {name}: no {where}", name=name, reason="not_found")
        answer = self.answers[where]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


def _registry(**answers: Any) -> tuple[SecretRegistry, list[VaultSource]]:
    made: list[VaultSource] = []

    def factory(context: SourceContext) -> SecretSource:
        made.append(VaultSource(context, answers or None))
        return made[-1]

    registry = SecretRegistry(SHIPPED)
    registry.register("vault", factory)
    return registry, made


def _resolve(
    refs: dict[str, str], registry: SecretRegistry, enabled: tuple[str, ...]
) -> tuple[dict[str, str], Redactor]:
    context = SourceContext(settings=Settings(), environ={"K": "env-value-1234"})
    redactor = Redactor()
    sources = registry.for_job(context, enabled)
    return resolve_credentials(refs, allowed=ALLOWED, sources=sources, redactor=redactor), redactor


def test_a_registered_and_enabled_source_resolves_and_is_redacted() -> None:
    registry, made = _registry()
    values, redactor = _resolve(
        {"CURSOR_API_KEY": "vault:kv/cursor", "CURSOR_AUTH_TOKEN": "env:K"},
        registry,
        ("env", "vault"),
    )
    assert values == {"CURSOR_API_KEY": VALUE, "CURSOR_AUTH_TOKEN": "env-value-1234"}
    assert redactor.scrub(f"x {VALUE} y") == f"x {MASK} y"
    assert [m.calls for m in made] == [["kv/cursor"]]
    assert made[0].context.environ["K"] == "env-value-1234"


def test_a_registered_but_disabled_scheme_is_refused_before_any_lookup() -> None:
    registry, made = _registry()
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": "vault:kv/cursor"}, registry, ("env", "file"))
    assert info.value.details == {
        "name": "CURSOR_API_KEY",
        "reason": "unknown_source",
        "enabled": ["env", "file"],
    }
    assert info.value.exit_code == 3
    assert made == []  # the source was never even built


def test_one_disabled_reference_stops_every_lookup() -> None:
    registry, made = _registry()
    refs = {"CURSOR_API_KEY": "vault:kv/cursor", "CURSOR_AUTH_TOKEN": "nope:x"}
    with pytest.raises(CredentialRefused) as info:
        _resolve(refs, registry, ("vault",))
    assert info.value.details["reason"] == "unknown_source"
    assert made == []


@pytest.mark.parametrize("ref", ["user:hunter2-password", "no-scheme-at-all", ":x", "Bearer:x"])
def test_an_unknown_scheme_is_refused_without_echoing_the_reference(ref: str) -> None:
    registry, _ = _registry()
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": ref}, registry, ("env", "file", "vault"))
    assert info.value.details["reason"] == "unknown_source"
    assert ref not in str(info.value.to_dict())


def test_an_enabled_scheme_that_is_not_installed_is_unknown() -> None:
    registry, _ = _registry()
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": "gcp-sm:x"}, registry, ("env", "gcp-sm"))
    assert info.value.details["enabled"] == ["env"]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("", "unresolved"),
        (12345, "unresolved"),
        ("x" * (MAX_SECRET_BYTES + 1), "too_large"),
        (RuntimeError(f"boom, the value was {VALUE}"), "source_failed"),
        (InvalidInput(f"typed, but not a refusal: {VALUE}"), "source_failed"),
    ],
)
def test_what_a_source_returns_is_checked(answer: Any, reason: str) -> None:
    registry, _ = _registry(**{"kv/cursor": answer})
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": "vault:kv/cursor"}, registry, ("vault",))
    assert info.value.details["reason"] == reason
    assert VALUE not in str(info.value.to_dict())
    assert info.value.__cause__ is None  # the third-party exception is not chained either


def test_a_source_refusal_passes_through() -> None:
    registry, _ = _registry()
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": "vault:kv/other"}, registry, ("vault",))
    assert info.value.details["reason"] == "not_found"


def test_a_factory_that_cannot_load_is_source_unavailable() -> None:
    registry = SecretRegistry()

    def broken(context: SourceContext) -> SecretSource:
        raise ImportError("No module named 'hvac'")

    registry.register("vault", broken)
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": "vault:kv/cursor"}, registry, ("vault",))
    assert info.value.details["reason"] == "source_unavailable"
    assert "hvac" in info.value.message


def test_each_source_is_built_once_per_job() -> None:
    registry, made = _registry(a="value-a-1234", b="value-b-1234")
    refs = {"CURSOR_API_KEY": "vault:a", "CURSOR_AUTH_TOKEN": "vault:b"}
    values, _ = _resolve(refs, registry, ("vault",))
    assert values == {"CURSOR_API_KEY": "value-a-1234", "CURSOR_AUTH_TOKEN": "value-b-1234"}
    assert [m.calls for m in made] == [["a", "b"]]


@pytest.mark.parametrize("scheme", ["Vault", "1password", "", "x" * 33, "a b", "env"])
def test_register_refuses_bad_or_taken_schemes(scheme: str) -> None:
    registry = SecretRegistry(SHIPPED)
    with pytest.raises(InvalidInput):
        registry.register(scheme, VaultSource)


def test_shipped_schemes() -> None:
    assert sorted(SHIPPED) == ["aws-sm", "env", "file"]


def test_split_reference() -> None:
    assert split_reference("aws-sm:prod/x#key") == ("aws-sm", "prod/x#key")
    assert split_reference("file:a:b") == ("file", "a:b")
    assert split_reference("Bearer:x") == ("", "Bearer:x")
    assert split_reference("plain") == ("", "plain")


def test_settings_take_a_comma_separated_list() -> None:
    assert Settings().secret_sources == ("env", "file")
    assert Settings(secret_sources=" env, aws-sm ,").secret_sources == ("env", "aws-sm")


# --- the job spec's reference grammar --------------------------------------------------


def _job(**credentials: str) -> dict[str, Any]:
    return {
        "v": 1,
        "job_id": "j",
        "pack": {"name": "cursor"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": "p",
        "credentials": credentials,
    }


@pytest.mark.parametrize(
    "ref",
    [
        "aws-sm:prod/cursor",
        "aws-sm:prod/cursor#api key",
        "aws-sm:arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/cursor-AbCdEf#k",
        "vault:kv/data/cursor",
        "env:K",
        "file:dir/key",
    ],
)
def test_the_spec_accepts_references_of_any_scheme(ref: str) -> None:
    assert parse_job(_job(CURSOR_API_KEY=ref)).credentials["CURSOR_API_KEY"] == ref


@pytest.mark.parametrize(
    "ref",
    ["env:1BAD", "env:A-B", "aws-sm:x\ny", "aws-sm:", "Vault:x", "sk-live-0123456789", "env:K\n"],
)
def test_the_spec_refuses_malformed_references_without_echoing_them(ref: str) -> None:
    with pytest.raises(InvalidJobSpec) as info:
        parse_job(_job(CURSOR_API_KEY=ref))
    assert ref not in str(info.value.to_dict())


def test_disk_mb_default_and_bounds() -> None:
    assert parse_job(_job()).limits.disk_mb == 10240
    for bad in (0, 15, 1024 * 1024 + 1, "big"):
        job = {**_job(), "limits": {"disk_mb": bad}}
        with pytest.raises(InvalidJobSpec, match=r"limits\.disk_mb"):
            parse_job(job)


# --- aws-sm: everything decided before or after the call, without a network -----------


def _aws(**settings: Any) -> aws_sm.AwsSecretsManager:
    context = SourceContext(settings=Settings(**settings), environ={})
    return aws_sm.AwsSecretsManager(context)


@pytest.mark.parametrize(
    "where", ["", "has space", "a#", "#k", "x" * 513, "a#b\x01", "ünï", "a#" + "k" * 257]
)
def test_aws_sm_refuses_malformed_references_before_any_call(where: str) -> None:
    source = _aws()
    with pytest.raises(CredentialRefused) as info:
        source.resolve(where, name="CURSOR_API_KEY")
    assert info.value.details["reason"] == "bad_reference"
    assert source._client is None  # no client made, nothing called


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("not json val-4c2e", "k", "not_json"),
        ('["val-4c2e"]', "k", "not_json"),
        ('{"other": "val-4c2e"}', "k", "missing_key"),
        ('{"k": 4244}', "k", "not_a_string"),
        ('{"k": {"nested": "val-4c2e"}}', "k", "not_a_string"),
    ],
)
def test_aws_sm_json_key_refusals(text: str, key: str, reason: str) -> None:
    with pytest.raises(CredentialRefused) as info:
        aws_sm._json_key(text, key, name="N", secret_id="s")
    assert info.value.details["reason"] == reason
    said = str(info.value.to_dict())
    assert "val-4c2e" not in said
    assert "4244" not in said


def test_aws_sm_json_key_value() -> None:
    assert aws_sm._json_key('{"k": "the-value"}', "k", name="N", secret_id="s") == "the-value"


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({"SecretBinary": b"\x00\x01"}, "not_a_string"),
        ({"SecretString": "x" * (MAX_SECRET_BYTES + 1)}, "too_large"),
        ({"SecretString": "é" * (MAX_SECRET_BYTES // 2 + 1)}, "too_large"),  # bytes, not chars
    ],
)
def test_aws_sm_secret_string_refusals(response: dict[str, Any], reason: str) -> None:
    with pytest.raises(CredentialRefused) as info:
        aws_sm._secret_string(response, name="N", secret_id="s")
    assert info.value.details["reason"] == reason


def _client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    body: Any = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(body, "GetSecretValue")


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("ResourceNotFoundException", 400, "not_found"),
        ("AccessDeniedException", 400, "denied"),
        ("DecryptionFailure", 400, "denied"),
        ("InvalidRequestException", 400, "unresolved"),
        ("ThrottlingException", 400, None),
        ("InternalServiceError", 500, None),
        ("Whatever", 503, None),
        ("", 429, None),
    ],
)
def test_aws_sm_error_codes(code: str, status: int, reason: str | None) -> None:
    translated = aws_sm._refusal(_client_error(code, status), name="N", secret_id="s")
    if reason is None:
        assert isinstance(translated, aws_sm._Transient)
    else:
        assert isinstance(translated, CredentialRefused)
        assert translated.details["reason"] == reason
