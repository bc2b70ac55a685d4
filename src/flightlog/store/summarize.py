"""Last and best metric values computed from a stream, for runs that never wrote them.

A run that finished has its summary in ``run.json``; a crashed run, a running run
seen by ``flightlog index``, or an imported log has only its records. This gives the
same shape as the writer's summary (``last_step``, ``last``, ``best``), ignoring
records that a resume superseded (the reader hides them). The better-direction of a metric follows the
writer's rule (``pipeline.summary.metric_goal``; the store may not import the
pipeline, and a test keeps the two in agreement).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Iterable

from flightlog.protocol import METRICS

_LOWER_IS_BETTER = re.compile(r"(loss|perplexity|ppl|error|wer|cer|_time_s$|nll)")
_HIGHER_IS_BETTER = re.compile(r"(acc|f1|bleu|rouge|mrr|recall|precision|auc|ndcg|map_|reward|exact_match|score)")
_ENVELOPE = frozenset({"type", "timestamp", "run_id", "step", "epoch"})


def metric_goal(name: str) -> int:
    """-1 when smaller is better (losses), +1 when larger is better (accuracies), else 0."""
    if name in _ENVELOPE or "learning_rate" in name or "time" in name:
        return 0
    if _LOWER_IS_BETTER.search(name):
        return -1
    if _HIGHER_IS_BETTER.search(name):
        return 1
    return 0


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
