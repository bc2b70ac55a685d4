"""Helpers the integrations share: JSON-safe hyper-parameters and a model's description."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of a config value: sets become sorted lists, enums their value,
    dtypes and other objects their ``str``; deep or cyclic structures are cut off."""
    if depth > 12:
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return jsonable(value.value, depth + 1)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value), depth + 1)
    return str(value)


def model_info(model: Any) -> dict[str, Any]:
    """Class, name, parameter counts, dtype, the model config and any peft adapter config."""
    if model is None:
        return {}
    info: dict[str, Any] = {"class": type(model).__name__}
    total = trainable = 0
    dtype = None
    seen: set[int] = set()
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel()
        if param.requires_grad:
            trainable += param.numel()
        if dtype is None and param.is_floating_point():
            dtype = str(param.dtype).replace("torch.", "")
    info.update(parameters=total, trainable_parameters=trainable, dtype=dtype)
    config = getattr(model, "config", None)
    if config is not None:
        name = getattr(config, "_name_or_path", None) or getattr(model, "name_or_path", None)
        if name:
            info["name_or_path"] = str(name)
        to_dict = getattr(config, "to_dict", None)
        if callable(to_dict):
            try:
                info["config"] = jsonable(to_dict())
            except Exception:
                pass
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, dict):
        info["peft_config"] = {name: jsonable(c.to_dict() if hasattr(c, "to_dict") else c) for name, c in peft.items()}
    return info


def model_name(model: Any) -> str | None:
    """A human name: the config's ``_name_or_path``, else the model type, else the class name."""
    if model is None:
        return None
    config = getattr(model, "config", None)
    for name in (getattr(config, "_name_or_path", None), getattr(config, "model_type", None)):
        if name:
            return str(name)
    return type(model).__name__
