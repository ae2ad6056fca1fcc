"""``aws-sm:<secret-id>[#<json-key>]``: a secret from AWS Secrets Manager.

Installed as the entry point ``aws-sm`` of ``acp_worker.secret_sources`` (the same way a
third-party source plugs in) and enabled by listing it in ``ACPW_SECRET_SOURCES``.
``<secret-id>`` is a secret name or ARN; with ``#<json-key>`` the secret string must be a
JSON object and the value is that key's string. The worker's own AWS identity reads it
(boto3's usual chain); ``ACPW_AWS_SM_ENDPOINT_URL`` / ``ACPW_AWS_SM_REGION`` point it
elsewhere (a VPC endpoint, LocalStack, moto in tests).

Throttling, 5xx answers and connection failures are retried (tenacity, three attempts,
bounded backoff; botocore's own retries are off so the bound is ours); everything else
refuses at once. boto3 errors are translated here, at the seam, by error code only: no
message from AWS and nothing read from the secret reaches a refusal.
"""

from __future__ import annotations

import json
import re
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from worker.credentials.sources import MAX_SECRET_BYTES, SourceContext
from worker.errors import CredentialRefused

_SECRET_ID = re.compile(r"^(arn:[A-Za-z0-9:/_+=.@-]{1,2040}|[A-Za-z0-9/_+=.@-]{1,512})$")
_JSON_KEY = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")
_TRANSIENT_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "InternalServiceError",
        "InternalFailure",
        "ServiceUnavailable",
        "RequestTimeout",
    }
)
_REASONS = {
    "ResourceNotFoundException": "not_found",
    "AccessDeniedException": "denied",
    "AccessDenied": "denied",
    "UnrecognizedClientException": "denied",
    "DecryptionFailure": "denied",
}
ATTEMPTS = 3


class _Transient(Exception):
    """A failure worth another attempt (carries what to report if it is the last)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class AwsSecretsManager:
    """The ``aws-sm`` secret source (one boto3 client per job, made on first use)."""

    scheme = "aws-sm"

    def __init__(self, context: SourceContext, *, wait_max_s: float = 2.0) -> None:
        self._settings = context.settings
        self._client: Any = None
        self._wait_max_s = wait_max_s

    def resolve(self, where: str, *, name: str) -> str:
        secret_id, key = _parse(where, name)
        text = self._fetch(secret_id, name)
        return text if key is None else _json_key(text, key, name=name, secret_id=secret_id)

    def client(self) -> Any:
        if self._client is None:
            config = botocore.config.Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=5,
                read_timeout=10,
            )
            self._client = boto3.client(
                "secretsmanager",
                endpoint_url=self._settings.aws_sm_endpoint_url,
                region_name=self._settings.aws_sm_region,
                config=config,
            )
        return self._client

    def _fetch(self, secret_id: str, name: str) -> str:
        retrying = Retrying(
            retry=retry_if_exception_type(_Transient),
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_exponential(multiplier=0.2, max=self._wait_max_s),
            reraise=True,
        )
        try:
            response = retrying(self._get, secret_id, name)
        except _Transient as exc:
            raise CredentialRefused(
                f"credential {name}: AWS Secrets Manager is unavailable ({exc.what}, "
                f"{ATTEMPTS} attempts)",
                name=name,
                reason="source_unavailable",
                secret_id=secret_id,
            ) from None
        return _secret_string(response, name=name, secret_id=secret_id)

    def _get(self, secret_id: str, name: str) -> dict[str, object]:
        try:
            response: dict[str, object] = self.client().get_secret_value(SecretId=secret_id)
        except botocore.exceptions.ClientError as exc:
            raise _refusal(exc, name=name, secret_id=secret_id) from None
        except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
            raise _Transient(type(exc).__name__) from None
        except botocore.exceptions.BotoCoreError as exc:  # no credentials, no region, …
            raise CredentialRefused(
                f"credential {name}: AWS Secrets Manager cannot be used ({type(exc).__name__})",
                name=name,
                reason="source_unavailable",
                secret_id=secret_id,
            ) from None
        return response


def _parse(where: str, name: str) -> tuple[str, str | None]:
    secret_id, sep, key = where.partition("#")
    if not _SECRET_ID.match(secret_id) or (sep and not _JSON_KEY.match(key)):
        raise CredentialRefused(
            f"credential {name}: an aws-sm reference is `aws-sm:<secret name or ARN>` "
            "with an optional `#<json key>`",
            name=name,
            reason="bad_reference",
        )
    return secret_id, (key if sep else None)


def _refusal(
    exc: botocore.exceptions.ClientError, *, name: str, secret_id: str
) -> CredentialRefused | _Transient:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in _TRANSIENT_CODES or status == 429 or status >= 500:
        return _Transient(code or f"HTTP {status}")
    reason = _REASONS.get(code, "unresolved")
    return CredentialRefused(
        f"credential {name}: AWS Secrets Manager refused secret {secret_id} ({code})",
        name=name,
        reason=reason,
        secret_id=secret_id,
        aws_error=code,
    )


def _secret_string(response: dict[str, object], *, name: str, secret_id: str) -> str:
    text = response.get("SecretString")
    if not isinstance(text, str):
        raise CredentialRefused(
            f"credential {name}: secret {secret_id} holds binary data, not a string",
            name=name,
            reason="not_a_string",
            secret_id=secret_id,
        )
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SECRET_BYTES:
        raise CredentialRefused(
            f"credential {name}: secret {secret_id} is larger than {MAX_SECRET_BYTES} bytes",
            name=name,
            reason="too_large",
            secret_id=secret_id,
        )
    return text


def _json_key(text: str, key: str, *, name: str, secret_id: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise CredentialRefused(
            f"credential {name}: secret {secret_id} is not a JSON object, so it has no keys",
            name=name,
            reason="not_json",
            secret_id=secret_id,
        )
    if key not in data:
        raise CredentialRefused(
            f"credential {name}: secret {secret_id} has no key {key!r}",
            name=name,
            reason="missing_key",
            secret_id=secret_id,
        )
    value = data[key]
    if not isinstance(value, str):
        raise CredentialRefused(
            f"credential {name}: key {key!r} of secret {secret_id} is not a string",
            name=name,
            reason="not_a_string",
            secret_id=secret_id,
        )
    return value
