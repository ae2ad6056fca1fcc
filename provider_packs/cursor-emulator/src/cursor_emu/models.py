"""Process-global model selection (Cursor persists it per process, FACTS §5)."""

from __future__ import annotations

from . import catalog

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from typing import Any

    from .catalog import JSON


class ModelError(Exception):
    """A rejected model or parameter value; `message` goes into error.data.message."""


class ModelPicker:
    """Holds the selected model in one of the two disjoint id spaces.

    The space is fixed at initialize by `_meta.parameterizedModelPicker`.
    """

    def __init__(self) -> None:
        self.parameterized = False
        self.current = catalog.DEFAULT_VARIANT
        self.params: dict[str, str] = {}

    def configure(self, parameterized: bool) -> None:
        self.parameterized = parameterized
        self.current = catalog.DEFAULT_BASE if parameterized else catalog.DEFAULT_VARIANT
        self.params = self._default_params(self.current)

    def _default_params(self, base: str) -> dict[str, str]:
        if not self.parameterized:
            return {}
        return {pid: spec[3] for pid, spec in catalog.BASE_MODELS[base][1].items()}

    def available(self) -> list[JSON]:
        if not self.parameterized:
            return [dict(m) for m in catalog.VARIANT_MODELS]
        return [{"modelId": mid, "name": spec[0]} for mid, spec in catalog.BASE_MODELS.items()]

    def models_state(self) -> JSON:
        return {"currentModelId": self.current, "availableModels": self.available()}

    def select(self, model_id: Any) -> None:
        """Select a listed id; a composed or foreign-space id is rejected (FACTS §5)."""
        ids = [m["modelId"] for m in self.available()]
        if not isinstance(model_id, str) or model_id not in ids:
            raise ModelError(f"Invalid model value: {model_id}")
        self.current = model_id
        # Switching the model resets its parameters to that model's defaults.
        self.params = self._default_params(model_id) if self.parameterized else {}

    def set_param(self, param_id: str, value: Any) -> bool:
        """Set one parameter of the current model; False when `param_id` is not one."""
        if not self.parameterized:
            return False
        spec = catalog.BASE_MODELS[self.current][1].get(param_id)
        if spec is None:
            return False
        if value not in spec[2]:
            raise ModelError(f"Invalid value for {param_id}: {value}")
        self.params[param_id] = value
        return True

    def config_options(self) -> list[JSON]:
        opts = [m for m in self.available()]
        model_opt = catalog.select_option(
            "model",
            "Model",
            "model",
            self.current,
            [{"value": m["modelId"], "name": m["name"]} for m in opts],
        )
        return [model_opt, *self._param_options()]

    def _param_options(self) -> list[JSON]:
        if not self.parameterized:
            return []
        out = []
        for pid, (name, category, values, _default) in catalog.BASE_MODELS[self.current][1].items():
            choices = [{"value": v, "name": v} for v in values]
            out.append(catalog.select_option(pid, name, category, self.params[pid], choices))
        return out

    def list_available_models(self) -> JSON:
        """Result of cursor/list_available_models: always the parameterized catalog."""
        models = []
        for mid, (name, params) in catalog.BASE_MODELS.items():
            options = [
                {
                    "id": pid,
                    "name": pname,
                    "description": f"{pname} for {name}",
                    "category": category,
                    "type": "select",
                    "currentValue": default,
                    "options": [{"value": v, "name": v} for v in values],
                }
                for pid, (pname, category, values, default) in params.items()
            ]
            models.append({"value": mid, "name": name, "configOptions": options})
        return {"models": models}
