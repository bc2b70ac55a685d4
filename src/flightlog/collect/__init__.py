"""Built-in collectors: timing, learning rate and stage, gradient norms, memory, system, task metrics.

Importing this package imports no torch; each name is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Collectors": "flightlog.collect.collectors",
    "StepTimer": "flightlog.collect.timing",
    "StepClock": "flightlog.collect.timing",
    "GradNorms": "flightlog.collect.grads",
    "SystemStats": "flightlog.collect.system",
    "CudaMemory": "flightlog.collect.device",
    "detect_precision": "flightlog.collect.device",
    "learning_rate": "flightlog.collect.optim",
    "warmup_steps_of": "flightlog.collect.optim",
    "stage": "flightlog.collect.optim",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flightlog.collect' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
