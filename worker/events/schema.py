"""The exported JSON Schema of canonical events (envelope + every type's data)."""

from __future__ import annotations

from worker.events.models import EVENT_TYPES, EVENT_VERSION, Envelope

SCHEMA_ID = "https://acp-worker.dev/schemas/events-v1.json"


def _variant(type_name: str, data_schema: dict[str, object]) -> dict[str, object]:
    return {
        "type": "object",
        "properties": {"type": {"const": type_name}, "data": data_schema},
        "required": ["type", "data"],
    }


def event_schema() -> dict[str, object]:
    """One JSON Schema (draft 2020-12) that every canonical event validates against."""
    defs: dict[str, object] = {}
    variants = []
    for name, model in EVENT_TYPES.items():
        schema = model.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        # The title, not the class name: the three delegation.* classes share one shape.
        title = model.model_config.get("title") or model.__name__
        defs[title] = schema
        variants.append(_variant(name, {"$ref": f"#/$defs/{title}"}))
    envelope = Envelope.model_json_schema()
    envelope["properties"]["type"] = {"enum": list(EVENT_TYPES)}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"acp-worker canonical event v{EVENT_VERSION}",
        **envelope,
        "allOf": [{"oneOf": variants}],
        "$defs": defs,
    }
