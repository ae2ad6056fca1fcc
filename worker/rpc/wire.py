"""JSON value types for the ACP wire (the JSON-RPC transport and the ACP client share them).

What the worker sends and answers is built as plain JSON objects in its own modules
(:mod:`worker.acp.client`, ``fs``, ``terminal``, ``permissions``); what it receives stays
the decoded JSON. The ``agent-client-protocol`` package's schema models (``acp.schema``)
are not imported anywhere under ``worker/``, for two reasons:

- Start-up time. ``python -X importtime -c 'import acp.schema'`` measured about 330 ms
  per process (pydantic building the package's models; 250-480 ms over 5 runs, and as
  much again after ``worker.cli`` had loaded pydantic). Building the requests from those
  models took ``acp-worker run examples/hello.json --quiet`` from 0.80 s to 1.17 s
  (median of 5 on a 2-core machine), for a job whose own work is under 200 ms.
- Fidelity. The models drop fields they do not know (pydantic's ``extra="ignore"``),
  coerce values (``"1"`` becomes ``1``) and salvage invalid ones to defaults, while the
  worker reports what the agent sent, unknown fields included, and Cursor sends shapes
  the schema does not describe.

The schema is enforced at the test boundary instead: ``tests/unit/test_acp_schema.py``
validates every request and reply the worker sends against its model, listing each
deliberate deviation, so a drift from the protocol fails CI without costing at run time.
"""

from __future__ import annotations

from typing import TypeAlias

#: A value decoded from (or encodable to) JSON.
JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
#: A JSON object, e.g. a request's params or result.
JsonObject: TypeAlias = "dict[str, JsonValue]"
