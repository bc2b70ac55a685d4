"""Mapping other tools' metric names onto the log protocol's names.

ms-swift, HF and TensorBoard tags use names like ``memory(GiB)``, ``train/loss`` or
``train_speed(iter/s)``; the protocol uses flat snake_case with seed names first
(``gpu_memory_mb``, ``loss``, ``step_time_s``). Unit conversions happen here once,
so every importer converts the same way.
"""

from __future__ import annotations

import re
from typing import Any

from flightlog.store.importers.base import number

_NON_WORD = re.compile(r"[^0-9a-zA-Z]+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)\b")
_CLOCK = re.compile(r"^(?:(\d+)\s*days?,\s*)?(\d+):(\d{1,2}):(\d{1,2}(?:\.\d+)?)$")

# name as written by the tool -> protocol name
ALIASES = {
    "lr": "learning_rate",
    "gpu_mem": "gpu_memory_mb",
    "grad_norm": "grad_norm",
    "loss": "loss",
}


def snake(name: str) -> str:
    """``memory(GiB)`` -> ``memory_gib``; ``train/loss`` -> ``train_loss``."""
    return _NON_WORD.sub("_", name).strip("_").lower()


def parse_duration(value: Any) -> float | None:
    """Seconds from ms-swift's ``"1h 2m 3s"``, a clock ``"0:01:22"``, or a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    clock = _CLOCK.match(text)
    if clock:
        days, h, m, s = clock.groups()
        return int(days or 0) * 86400 + int(h) * 3600 + int(m) * 60 + float(s)
    parts = _DURATION_PART.findall(text)
    if parts and _DURATION_PART.sub("", text).strip() == "":
        scale = {"d": 86400, "h": 3600, "m": 60, "s": 1}
        return sum(float(n) * scale[u] for n, u in parts)
    return number(text)


def swift_field(key: str, value: Any) -> list[tuple[str, Any]] | None:
    """Protocol (name, value) pairs for one ms-swift field, or None when the value is unusable.

    Handles the unit-bearing names of both field sets: ``memory(GiB)`` (-> MiB),
    ``train_speed(iter/s)`` (old) and ``train_speed(s/it)`` (since 2026), both -> ``step_time_s``
    and kept under their own snake_case name too.
    """
    if key == "memory(GiB)":
        v = number(value)
        return None if v is None else [("gpu_memory_mb", v * 1024.0)]
    if key == "train_speed(iter/s)":
        v = number(value)
        if v is None:
            return None
        return [("train_speed_iter_per_s", v)] + ([("step_time_s", 1.0 / v)] if v > 0 else [])
    if key == "train_speed(s/it)":
        v = number(value)
        return None if v is None else [("train_speed_s_per_it", v), ("step_time_s", v)]
    if key in ("elapsed_time", "remaining_time"):
        v = parse_duration(value)
        return None if v is None else [(f"{key}_s", v)]
    if key == "percentage":
        v = number(value)
        return None if v is None else [("progress_percent", v)]
    v = number(value)
    return None if v is None else [(ALIASES.get(key, snake(key)), v)]
