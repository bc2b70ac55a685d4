"""Mapping other tools' metric names onto the log protocol's names.

ms-swift, HF and TensorBoard tags use names like ``memory(GiB)``, ``train/loss`` or
``train_speed(iter/s)``; the protocol uses flat snake_case with seed names first
(``gpu_memory_mb``, ``loss``, ``step_time_s``). Unit conversions happen here once,
so every importer converts the same way.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable

from flightlog.store.importers.base import number

_NON_WORD = re.compile(r"[^0-9a-zA-Z]+")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?$")
_CLOCK = re.compile(r"^(?:(\d+)\s*days?,\s*)?(\d+):(\d{1,2}):(\d{1,2}(?:\.\d+)?)$")

# name as written by the tool -> protocol name
ALIASES = {
    "lr": "learning_rate",
    "gpu_mem": "gpu_memory_mb",
    "grad_norm": "grad_norm",
    "loss": "loss",
}


@lru_cache(maxsize=4096)
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
    parts = _DURATION.match(text)
    if parts and any(parts.groups()):
        d, h, m, sec = (float(x) if x else 0.0 for x in parts.groups())
        return d * 86400 + h * 3600 + m * 60 + sec
    clock = _CLOCK.match(text)
    if clock:
        days, h2, m2, s2 = clock.groups()
        return int(days or 0) * 86400 + int(h2) * 3600 + int(m2) * 60 + float(s2)
    return number(text)


def _memory(value: Any) -> list[tuple[str, Any]] | None:
    v = number(value)
    return None if v is None else [("gpu_memory_mb", v * 1024.0)]


def _iter_per_s(value: Any) -> list[tuple[str, Any]] | None:
    v = number(value)
    if v is None:
        return None
    return [("train_speed_iter_per_s", v)] + ([("step_time_s", 1.0 / v)] if v > 0 else [])


def _s_per_it(value: Any) -> list[tuple[str, Any]] | None:
    v = number(value)
    return None if v is None else [("train_speed_s_per_it", v), ("step_time_s", v)]


def _duration(name: str) -> Callable[[Any], list[tuple[str, Any]] | None]:
    def convert(value: Any) -> list[tuple[str, Any]] | None:
        v = parse_duration(value)
        return None if v is None else [(name, v)]

    return convert


def _plain(name: str) -> Callable[[Any], list[tuple[str, Any]] | None]:
    def convert(value: Any) -> list[tuple[str, Any]] | None:
        if value.__class__ is float or value.__class__ is int:
            return [(name, value)]
        v = number(value)
        return None if v is None else [(name, v)]

    return convert


_SPECIAL: dict[str, Callable[[Any], list[tuple[str, Any]] | None]] = {
    "memory(GiB)": _memory,
    "train_speed(iter/s)": _iter_per_s,
    "train_speed(s/it)": _s_per_it,
    "elapsed_time": _duration("elapsed_time_s"),
    "remaining_time": _duration("remaining_time_s"),
    "percentage": _plain("progress_percent"),
}


@lru_cache(maxsize=4096)
def _converter(key: str) -> Callable[[Any], list[tuple[str, Any]] | None]:
    return _SPECIAL.get(key) or _plain(ALIASES.get(key) or snake(key))


def swift_field(key: str, value: Any) -> list[tuple[str, Any]] | None:
    """Protocol (name, value) pairs for one ms-swift field, or None when the value is unusable.

    Handles the unit-bearing names of both field sets: ``memory(GiB)`` (-> MiB),
    ``train_speed(iter/s)`` (old) and ``train_speed(s/it)`` (since 2026), both -> ``step_time_s``
    and kept under their own snake_case name too.
    """
    return _converter(key)(value)
