"""The run's summary, kept up to date as records pass: last step, last and best values.

Observed by the writer after redaction, so ``run_end`` and ``run.json`` can say how the
run ended without anyone re-reading the stream.
"""

from __future__ import annotations

from typing import Any

from flightlog.protocol import metric_goal

_SKIP = frozenset({"type", "timestamp", "run_id", "step", "epoch"})


class SummaryTracker:
    """Remembers last and best metric values; ``observe`` is called by the writer per metrics record."""

    def __init__(self) -> None:
        self.last_step: Any = None
        self.last: dict[str, Any] = {}
        self.best: dict[str, Any] = {}
        self.best_step: dict[str, Any] = {}
        self.metrics_records = 0
        self._seen: set[str] = set()
        self._goals: dict[str, int] = {}

    def observe(self, record: dict[str, Any]) -> None:
        self.metrics_records += 1
        step = record.get("step")
        if step is not None:
            self.last_step = step
        self.last.update(record)
        if not self._seen.issuperset(record):
            new = record.keys() - self._seen
            self._seen.update(new)
            for key in new:
                if goal := metric_goal(key):
                    self._goals[key] = goal
        best = self.best
        for key, goal in self._goals.items():
            value = record.get(key)
            if type(value) in (int, float) and value == value:
                old = best.get(key)
                if old is None or (value < old if goal < 0 else value > old):
                    best[key] = value
                    self.best_step[key] = step

    def summary(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step,
            "metrics_records": self.metrics_records,
            "last": {k: v for k, v in self.last.items() if k not in _SKIP},
            "best": {k: {"value": v, "step": self.best_step.get(k)} for k, v in self.best.items()},
        }
