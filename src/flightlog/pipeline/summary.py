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
        self.observe_batch([record])

    def observe_batch(self, records: list[dict[str, Any]]) -> None:
        """Take a batch of metrics records in order; per record only C-level dict/set calls.

        The best value of each goal metric is found with list comprehensions and ``min``/
        ``max`` over the batch; ties keep the earliest step, as one-by-one observing would.
        """
        if not records:
            return
        self.metrics_records += len(records)
        update, seen = self.last.update, self._seen
        for record in records:
            update(record)
            if not seen.issuperset(record):
                self._learn(record)
        for record in reversed(records):
            step = record.get("step")
            if step is not None:
                self.last_step = step
                break
        best = self.best
        for key, goal in self._goals.items():
            values = [record.get(key) for record in records]
            numbers = [v for v in values if (type(v) is float or type(v) is int) and v == v]
            if not numbers:
                continue
            candidate = min(numbers) if goal < 0 else max(numbers)
            old = best.get(key)
            if old is None or (candidate < old if goal < 0 else candidate > old):
                best[key] = candidate
                self.best_step[key] = records[values.index(candidate)].get("step")

    def _learn(self, record: dict[str, Any]) -> None:
        new = record.keys() - self._seen
        self._seen.update(new)
        for key in new:
            if goal := metric_goal(key):
                self._goals[key] = goal

    def summary(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step,
            "metrics_records": self.metrics_records,
            "last": {k: v for k, v in self.last.items() if k not in _SKIP},
            "best": {k: {"value": v, "step": self.best_step.get(k)} for k, v in self.best.items()},
        }
