"""Selecting the job's model exactly, or refusing with ``model_unavailable``.

Models are config options (``category: "model"``); ``session/set_model`` is the legacy
path, used only when the agent offers no model option or does not implement
``session/set_config_option``. The model is set first (switching it resets its
parameters), then each parameter the job names, and after every call the agent's echo
must match exactly — no silent substitution. Parameters the agent exposes but the job
did not name are never set on its behalf (a catalog default such as ``fast=true`` can
raise cost): they are reported in ``model.selected`` as the agent's defaults.

The options are read from the results as the agent sent them, not through the schema's
``SessionConfigOptionSelect``: the exact-echo check must see the agent's own values, the
model drops fields it does not know and skips options it cannot parse, and the legacy
``models`` list is not in the schema at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NotRequired, TypedDict

from worker.acp.client import AcpClient
from worker.errors import AgentError, ModelUnavailable, Unsupported
from worker.rpc.wire import JsonValue

NON_PARAMS = frozenset({"mode", "model"})


def variant_params(model_id: str) -> dict[str, str]:
    """The parameters encoded in a variant id ``base[k=v,…]``."""
    if not model_id.endswith("]") or "[" not in model_id:
        return {}
    inner = model_id[model_id.index("[") + 1 : -1]
    parts = (part.partition("=") for part in inner.split(",") if "=" in part)
    return {key: value for key, _, value in parts}


#: A config option (or any object) as the agent sent it.
Option = Mapping[str, JsonValue]


class Selection(TypedDict):
    """The ``model.selected`` data (:class:`worker.events.models.ModelSelected`'s fields)."""

    source: Literal["job", "default"]
    model: str | None
    params: dict[str, str]
    defaults: dict[str, str]
    picker: Literal["variant", "parameterized"]
    via: Literal["config_option", "set_model"] | None
    verified: bool
    reasoning: NotRequired[str]


def _list(value: JsonValue) -> list[JsonValue]:
    """A list as sent; anything else has no items (a number no longer raises)."""
    return value if isinstance(value, list) else []


def _options(result: JsonValue | Mapping[str, JsonValue]) -> list[Option] | None:
    options = result.get("configOptions") if isinstance(result, Mapping) else None
    if not isinstance(options, list):
        return None
    return [o for o in options if isinstance(o, Mapping)]


def _find(options: Sequence[Option], *, id_: str) -> Option | None:
    return next((o for o in options if o.get("id") == id_), None)


def _model_option(options: Sequence[Option]) -> Option | None:
    return next((o for o in options if o.get("category") == "model"), None) or _find(
        options, id_="model"
    )


def _values(option: Option) -> list[str]:
    choices = option.get("options")
    return [str(c["value"]) for c in _list(choices) if isinstance(c, Mapping) and "value" in c]


#: The parameters that carry a model's thinking level, in the order they are looked for.
LEVEL_PARAMS = ("reasoning", "effort", "reasoning_effort", "thinking")
#: What each job level may become in a level parameter, most preferred first. Nothing
#: else is taken: a level the catalog does not offer is refused, never stepped up.
LEVEL_VALUES: dict[str, tuple[str, ...]] = {
    "off": ("none", "off"),
    "low": ("low",),
    "medium": ("medium",),
    "high": ("high",),
    "xhigh": ("xhigh", "extra-high"),
    "max": ("max",),
}


def level_value(param: str, level: str, offered: Sequence[str]) -> str | None:
    """The value of ``param`` that means thinking ``level``, if the catalog offers one:
    a boolean ``thinking`` is ``false`` for ``off`` and ``true`` for any other level."""
    if param == "thinking" and set(offered) <= {"false", "true"}:
        wanted: tuple[str, ...] = ("false",) if level == "off" else ("true",)
    else:
        wanted = LEVEL_VALUES[level]
    return next((value for value in wanted if value in offered), None)


class ModelSelector:
    """Selects ``model`` with ``params`` in one session."""

    def __init__(self, client: AcpClient, session_id: str, *, parameterized: bool) -> None:
        self._client = client
        self._session = session_id
        self._picker: Literal["variant", "parameterized"] = (
            "parameterized" if parameterized else "variant"
        )

    async def select(
        self,
        session: Mapping[str, JsonValue],
        model: str,
        params: Mapping[str, str],
        reasoning: str | None = None,
    ) -> Selection:
        """The ``model.selected`` data once the agent echoed exactly this selection
        (``reasoning``: a job's thinking level, set after the model and its ``params``).

        Raises:
            ModelUnavailable: the model, a parameter or a value is not offered, the agent
                refused it, or it echoed something else.
        """
        options = _options(session) or []
        option = _model_option(options)
        if option is not None:
            try:
                selected = await self._by_config(options, option, model, params, reasoning)
            except Unsupported:
                pass  # the agent lists options but cannot set them: the legacy call
            else:
                return selected
        if reasoning is not None:
            raise ModelUnavailable(
                "the agent offers no config options, so a thinking level cannot be set",
                model=model,
                reasoning=reasoning,
            )
        return await self._by_set_model(session, model, params)

    async def _by_config(
        self,
        options: list[Option],
        option: Option,
        model: str,
        params: Mapping[str, str],
        reasoning: str | None,
    ) -> Selection:
        _offered(option, model, what="model")
        options = await self._set(str(option["id"]), model, options)
        if reasoning is not None:
            params = {**params, **_level(options, model, reasoning, params)}
        for name, value in params.items():
            param = _find(options, id_=name)
            if param is None or name in NON_PARAMS:
                raise ModelUnavailable(
                    f"model {model!r} has no parameter {name!r}",
                    model=model,
                    parameters=sorted(
                        str(o.get("id")) for o in options if o.get("id") not in NON_PARAMS
                    ),
                )
            _offered(param, value, what=f"{name} value")
            options = await self._set(name, value, options)
        selected = self._selected(model, params, options, via="config_option", verified=True)
        if reasoning is not None:
            selected["reasoning"] = reasoning
        return selected

    async def _set(self, config_id: str, value: str, options: list[Option]) -> list[Option]:
        try:
            result = await self._client.set_config_option(self._session, config_id, value)
        except Unsupported:
            raise
        except AgentError as exc:
            raise ModelUnavailable(
                f"the agent refused {config_id}={value!r}: {exc.message}", **exc.details
            ) from None
        refreshed = _options(result)
        echoed = _find(refreshed or [], id_=config_id)
        if echoed is None or echoed.get("currentValue") != value:
            got = None if echoed is None else echoed.get("currentValue")
            raise ModelUnavailable(
                f"the agent did not echo {config_id}={value!r} (it reports {got!r})",
                config_id=config_id,
                requested=value,
                echoed=got,
            )
        return refreshed or options

    async def _by_set_model(
        self, session: Mapping[str, JsonValue], model: str, params: Mapping[str, str]
    ) -> Selection:
        if params:
            raise ModelUnavailable(
                "the agent offers no config options, so model parameters cannot be set",
                model=model,
            )
        models = session.get("models")
        listed = models.get("availableModels") if isinstance(models, Mapping) else None
        ids = [
            str(m["modelId"]) for m in _list(listed) if isinstance(m, Mapping) and "modelId" in m
        ]
        if model not in ids:
            raise ModelUnavailable(
                f"model {model!r} is not offered by the agent", model=model, available=ids[:50]
            )
        try:
            await self._client.set_model(self._session, model)
        except AgentError as exc:
            raise ModelUnavailable(f"the agent refused model {model!r}", **exc.details) from None
        return self._selected(model, {}, [], via="set_model", verified=False)

    def _selected(
        self,
        model: str,
        params: Mapping[str, str],
        options: Sequence[Option],
        *,
        via: Literal["config_option", "set_model"],
        verified: bool,
    ) -> Selection:
        named = dict(params) or variant_params(model)
        return {
            "source": "job",
            "model": model,
            "params": named,
            "defaults": _defaults(options, named=named),
            "picker": self._picker,
            "via": via,
            "verified": verified,
        }


def default_selection(session: Mapping[str, JsonValue], *, parameterized: bool) -> Selection:
    """The ``model.selected`` data of a job that named no model (``source: default``):
    the model the agent says it uses (the model option's ``currentValue``, else the
    legacy ``models.currentModelId``; None when it says neither) and the values of
    every parameter it exposes, all the agent's defaults. Nothing is set."""
    options = _options(session) or []
    option = _model_option(options)
    model: str | None = None
    defaults: dict[str, str] = {}
    if option is not None and isinstance(option.get("currentValue"), str):
        model = str(option["currentValue"])
        defaults = _defaults(options, named={})
    else:
        models = session.get("models")
        current = models.get("currentModelId") if isinstance(models, Mapping) else None
        if isinstance(current, str):
            model = current
            defaults = variant_params(current)
    return {
        "source": "default",
        "model": model,
        "params": {},
        "defaults": defaults,
        "picker": "parameterized" if parameterized else "variant",
        "via": None,
        "verified": False,
    }


def _defaults(options: Sequence[Option], *, named: Mapping[str, str]) -> dict[str, str]:
    """The exposed parameters not in ``named``, at the values the agent reports."""
    return {
        str(o["id"]): str(o.get("currentValue"))
        for o in options
        if o.get("id") not in NON_PARAMS
        and o.get("id") not in named
        and "id" in o
        and o.get("category") != "mode"
    }


#: Parameter values that raise a turn's cost when an agent's catalog defaults to them
#: (Cursor's ``fast=true``): never left on without saying so.
COST_RAISING = {"fast": frozenset({"true"})}


def cost_raising(defaults: Mapping[str, str]) -> dict[str, str]:
    """The defaults among ``defaults`` that raise cost."""
    return {k: v for k, v in defaults.items() if v in COST_RAISING.get(k, frozenset())}


def _level(
    options: Sequence[Option], model: str, level: str, params: Mapping[str, str]
) -> dict[str, str]:
    """The parameter and value that set thinking ``level`` for ``model``.

    Raises:
        ModelUnavailable: the model exposes no level parameter, the job also names that
            parameter, or no offered value means ``level``.
    """
    param = next((p for name in LEVEL_PARAMS if (p := _find(options, id_=name))), None)
    if param is None:
        raise ModelUnavailable(
            f"model {model!r} exposes no thinking level ({', '.join(LEVEL_PARAMS)})",
            model=model,
            reasoning=level,
        )
    name = str(param["id"])
    if name in params:
        raise ModelUnavailable(
            f"the job names both `reasoning` and the parameter it sets ({name!r})",
            model=model,
            parameter=name,
        )
    offered = _values(param)
    value = level_value(name, level, offered)
    if value is None:
        raise ModelUnavailable(
            f"model {model!r} offers no {name} value for thinking level {level!r} "
            "(a higher one is never chosen instead)",
            model=model,
            parameter=name,
            reasoning=level,
            available=offered[:50],
        )
    return {name: value}


def _offered(option: Option, value: str, *, what: str) -> None:
    values = _values(option)
    if value not in values:
        raise ModelUnavailable(
            f"{what} {value!r} is not offered by the agent", requested=value, available=values[:50]
        )
