"""JSON value types for the ACP wire, and the one way a schema model becomes params.

What we *send* is built from the ``agent-client-protocol`` schema models (``acp.schema``),
so a field name or a value type that the protocol does not have fails here, in the
worker, instead of at the agent. What we *receive* stays the decoded JSON: those models
ignore fields they do not know (pydantic's default ``extra="ignore"``) and salvage
invalid ones to defaults, while the worker reports what the agent sent, unknown fields
included, and Cursor sends shapes the schema does not describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from pydantic import BaseModel

#: A value decoded from (or encodable to) JSON.
JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
#: A JSON object, e.g. a request's params or result.
JsonObject: TypeAlias = "dict[str, JsonValue]"


def to_wire(model: BaseModel, *, order: Sequence[str] = ()) -> JsonObject:
    """``model`` as the JSON object that goes on the wire.

    Only the fields the caller set are sent (``exclude_unset``): the models give optional
    fields defaults (``clientCapabilities.auth``, ``_meta``) that the worker has never
    sent. Keys come in the model's field order, except that ``order`` names keys to put
    first: a few requests have always been sent in another order than the schema
    declares, and the wire stays byte-identical so captured transcripts compare equal.
    """
    dumped: JsonObject = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    first = {key: dumped[key] for key in order if key in dumped}
    return first | {key: value for key, value in dumped.items() if key not in first}
