"""Last and best metric values computed from a stream, for runs that never wrote them.

A run that finished has its summary in ``run.json``; a crashed run, a running run
seen by ``flightlog index``, or an imported log has only its records. This gives the
same shape as the writer's summary (``last_step``, ``last``, ``best``), ignoring
records that a resume superseded (the reader hides them). The better-direction of a
metric is the protocol's (``protocol.metric_goal``), the same rule the writer uses.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Iterable

from flightlog.protocol import METRICS, metric_goal

_ENVELOPE = frozenset({"type", "timestamp", "run_id", "step", "epoch"})


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``{"last_step", "metrics_records", "last", "best"}`` over metrics records (in file order)."""
    last: dict[str, Any] = {}
    best: dict[str, dict[str, Any]] = {}
    goals: dict[str, int] = {}
    last_step = None
    count = 0
    for record in records:
        if record.get("type") != METRICS:
            continue
        step = record.get("step")
        count += 1
        if step is not None:
            last_step = step
        for key, value in record.items():
            if key in _ENVELOPE:
                continue
            last[key] = value
            goal = goals.get(key)
            if goal is None:
                goal = goals[key] = metric_goal(key)
            if goal and type(value) in (int, float) and value == value:
                old = best.get(key)
                if old is None or (value < old["value"] if goal < 0 else value > old["value"]):
                    best[key] = {"value": value, "step": step}
    return {"last_step": last_step, "metrics_records": count, "last": last, "best": best}


def summarize_stream(log_dir: Path) -> dict[str, Any]:
    """The summary of a run folder's stream (superseded records hidden); empty without a stream."""
    from flightlog.store.reader import read_records

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a live run's torn last line is normal here
        try:
            return summarize(read_records(log_dir, types=[METRICS]))
        except FileNotFoundError:
            return summarize([])
