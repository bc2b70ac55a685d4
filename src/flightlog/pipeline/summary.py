"""The run's summary, kept up to date as records pass: last step, last and best values.

A processor at the end of the chain (after redaction), so ``run_end`` and ``run.json``
can say how the run ended without anyone re-reading the stream.
"""

from __future__ import annotations

import re
from typing import Any

from flightlog.protocol import METRICS

_LOWER_IS_BETTER = re.compile(r"(loss|perplexity|ppl|error|wer|cer|_time_s$|nll)")
_HIGHER_IS_BETTER = re.compile(r"(acc|f1|bleu|rouge|mrr|recall|precision|auc|ndcg|map_|reward|exact_match|score)")
_SKIP = frozenset({"type", "timestamp", "run_id", "step", "epoch"})


def metric_goal(name: str) -> int:
    """-1 when smaller is better (losses), +1 when larger is better (accuracies), else 0."""
    if name in _SKIP or "learning_rate" in name or "time" in name:
        return 0
    if _LOWER_IS_BETTER.search(name):
        return -1
    if _HIGHER_IS_BETTER.search(name):
        return 1
    return 0


class SummaryTracker:
    """Processor: ``record -> record`` that remembers last/best metric values."""

    skip_emitted = True
    __name__ = "summary"

    def __init__(self) -> None:
        self.last_step: Any = None
        self.last: dict[str, Any] = {}
        self.best: dict[str, Any] = {}
        self.best_step: dict[str, Any] = {}
        self.metrics_records = 0
        self._goals: dict[str, int] = {}

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if record.get("type") != METRICS:
            return record
        self.metrics_records += 1
        step = record.get("step")
        if step is not None:
            self.last_step = step
        goals = self._goals
        best = self.best
        for key, value in record.items():
            goal = goals.get(key)
            if goal is None:
                goal = goals[key] = metric_goal(key)
            if key in _SKIP:
                continue
            self.last[key] = value
            if goal and type(value) in (int, float) and value == value:
                old = best.get(key)
                if old is None or (value < old if goal < 0 else value > old):
                    best[key] = value
                    self.best_step[key] = step
        return record

    def summary(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step,
            "metrics_records": self.metrics_records,
            "last": dict(self.last),
            "best": {k: {"value": v, "step": self.best_step.get(k)} for k, v in self.best.items()},
        }
