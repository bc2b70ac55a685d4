"""What the metric-store sinks (tensorboard, prometheus, wandb, mlflow) share.

Those stores hold numbers, so a metrics record is reduced to its numeric fields:
ints and floats, plus the protocol's ``"NaN"``/``"Infinity"``/``"-Infinity"`` strings
turned back into floats (a NaN loss must reach the dashboard as NaN, not vanish).
Strings such as ``stage`` or ``precision``, bools, lists and dicts are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Iterator

from flightlog.protocol import EVAL_PREFIX, NONFINITE_STRINGS, parse_timestamp

# Envelope fields that are not metrics (``epoch`` is: it is drawn as train/epoch, as HF does).
NOT_METRICS = frozenset({"type", "timestamp", "run_id", "step", "rank", "segment"})


def scalar_fields(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """``(name, value)`` for every numeric field of a metrics record."""
    for key, value in record.items():
        if key in NOT_METRICS:
            continue
        kind = type(value)
        if kind is float or kind is int:
            yield key, float(value)
        elif kind is str and value in NONFINITE_STRINGS:
            yield key, NONFINITE_STRINGS[value]


def namespaced(name: str) -> str:
    """HF's layout: ``eval_loss`` -> ``eval/loss``, everything else -> ``train/NAME``."""
    if name.startswith(EVAL_PREFIX) and len(name) > len(EVAL_PREFIX):
        return "eval/" + name[len(EVAL_PREFIX):]
    return "train/" + name


def record_time(record: Mapping[str, Any]) -> float:
    """The record's own time (seconds since the epoch), or now if it has none."""
    try:
        return parse_timestamp(record["timestamp"])
    except (KeyError, ValueError, TypeError, AttributeError):
        return time.time()


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested hyper-parameters as ``{"optim.lr": 1e-4}``; lists become their JSON text, None is left out."""
    import orjson

    out: dict[str, bool | int | float | str] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif value is None:
            continue
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            try:
                out[name] = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
            except TypeError:
                out[name] = str(value)
    return out
