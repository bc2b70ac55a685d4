"""The run's summary, kept up to date as records pass: last step, last and best values.

Observed by the writer after redaction, so ``run_end`` and ``run.json`` can say how the
run ended without anyone re-reading the stream.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import Any, Sequence

from flightlog.protocol import metric_goal

_NUMBERS = frozenset({float, int})  # (bool is no measurement to rank)
_SKIP = frozenset({"type", "timestamp", "run_id", "step", "epoch"})


def _numbers_without_nan(values: list[Any]) -> bool:
    try:
        return _NUMBERS.issuperset(map(type, values)) and (total := sum(values)) == total
    except OverflowError:  # (an integer beyond the float range: compared one by one)
        return False


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

    def observe_batch(self, records: Sequence[dict[str, Any]], steps: Sequence[Any] | None = None) -> None:
        """Take a batch of metrics records in order, with C-level passes over the batch.

        ``records`` are whole records, or (the writer's fast path, with ``steps``) only
        their metric fields, the steps given beside them. When the last one holds every
        key of the batch (the usual case: the same metrics each step) the last values are
        its values; the best value of each goal metric is ``min``/``max`` over the batch,
        ties keeping the earliest step, as one-by-one observing would.
        """
        if not records:
            return
        self.metrics_records += len(records)
        keys = set().union(*records)
        if not self._seen.issuperset(keys):
            self._learn(keys)
        final = records[-1]
        if len(final) == len(keys):
            self.last.update(final)
        else:
            deque(map(self.last.update, records), maxlen=0)
        if steps is None:
            steps = list(map(dict.get, records, repeat("step")))
        step = steps[-1]
        if step is None:
            known = [s for s in steps if s is not None]
            step = known[-1] if known else None
        if step is not None:
            self.last_step = step
        best = self.best
        for key, goal in self._goals.items():
            if key not in keys:
                continue
            values = list(map(dict.get, records, repeat(key)))
            if _numbers_without_nan(values):
                candidate = min(values) if goal < 0 else max(values)
                at = values.index(candidate)
            else:  # skip what is not a measurement: missing, text, bools, NaN
                numbers = [(v, i) for i, v in enumerate(values) if (type(v) is float or type(v) is int) and v == v]
                if not numbers:
                    continue
                candidate, at = min(numbers) if goal < 0 else max(numbers, key=lambda pair: (pair[0], -pair[1]))
            old = best.get(key)
            if old is None or (candidate < old if goal < 0 else candidate > old):
                best[key] = candidate
                self.best_step[key] = steps[at]

    def _learn(self, keys: set[str]) -> None:
        new = keys - self._seen
        self._seen.update(new)
        for key in new:
            if type(key) is str and (goal := metric_goal(key)):  # (a non-string key is written as text, ranked never)
                self._goals[key] = goal

    def summary(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step,
            "metrics_records": self.metrics_records,
            "last": {k: v for k, v in self.last.items() if k not in _SKIP},
            "best": {k: {"value": v, "step": self.best_step.get(k)} for k, v in self.best.items()},
        }
