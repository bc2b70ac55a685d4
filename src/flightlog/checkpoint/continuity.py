"""Continuity check: after a resume, are the first losses the ones the crashed process
logged for the same steps? (The seeds' "watch whether the first 10 steps' loss is
continuous".) The answer is an event: exact, within tolerance, or diverged at step S.

The stream is read with the store's reader (``flightlog.store.reader.tagged_records``).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from flightlog.protocol import EVENT, METRICS, RUN_END, RUN_START, superseded_after

def visible_records(log_dir: str | os.PathLike[str], before_segment: int | None = None) -> list[dict[str, Any]]:
    """The run's records with superseded ones hidden (each record gets its ``segment``).

    ``before_segment`` limits the view to earlier segments: what the run looked like
    before that segment started.
    """
    from flightlog.store.reader import tagged_records

    with warnings.catch_warnings():  # a torn last line of the crashed process is expected here
        warnings.simplefilter("ignore")
        rows = [(s, r) for s, r in tagged_records(log_dir) if before_segment is None or s < before_segment]
    limits = superseded_after([r for _, r in rows if r.get("type") == RUN_START])
    out = []
    for segment, record in rows:
        step = record.get("step")
        if step is not None and step > limits.get(segment, math.inf):
            continue
        out.append({**record, "segment": segment})
    return out


def metric_series(log_dir: str | os.PathLike[str], metric: str = "loss") -> dict[int, float]:
    """``{step: value}`` of one metric over the visible records; raises if a step appears twice."""
    series: dict[int, float] = {}
    for record in visible_records(log_dir):
        if record.get("type") == METRICS and metric in record and record.get("step") is not None:
            step = int(record["step"])
            if step in series:
                raise ValueError(f"flightlog: step {step} appears twice in the visible records of {log_dir}")
            series[step] = record[metric]
    return series


class ContinuityCheck:
    """A writer-thread processor comparing the first ``steps`` values of ``metric`` after
    a resume with the superseded values for the same steps."""

    skip_emitted = True

    def __init__(self, run: Any, expected: dict[int, float], resumed_from_step: int, *, metric: str = "loss", rtol: float = 1e-3, atol: float = 1e-8) -> None:
        self.run = run
        self.expected = expected
        self.resumed_from_step = resumed_from_step
        self.metric = metric
        self.rtol = rtol
        self.atol = atol
        self.seen: dict[int, float] = {}
        self.done = not expected
        self.result: dict[str, Any] | None = None
        self.__name__ = "continuity_check"

    @classmethod
    def attach(cls, run: Any, *, resumed_from_step: int, steps: int = 10, metric: str = "loss", rtol: float = 1e-3, atol: float = 1e-8) -> "ContinuityCheck":
        """Read the values the earlier segments logged after ``resumed_from_step`` and
        register the check on ``run``."""
        if steps < 1:
            raise ValueError(f"flightlog: continuity steps must be >= 1, got {steps!r}")
        expected: dict[int, float] = {}
        for record in visible_records(run.log_dir, before_segment=run.segment):
            step = record.get("step")
            if record.get("type") == METRICS and metric in record and step is not None and resumed_from_step < step:
                expected[int(step)] = record[metric]
        window = sorted(expected)[:steps]
        check = cls(run, {s: expected[s] for s in window}, resumed_from_step, metric=metric, rtol=rtol, atol=atol)
        run.add_processor(check)
        return check

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if self.done:
            return record
        kind = record.get("type")
        if kind == METRICS:
            step = record.get("step")
            if step in self.expected and self.metric in record:
                self.seen[step] = record[self.metric]
                if len(self.seen) == len(self.expected):
                    self._report()
        elif kind == RUN_END and self.seen:
            self._report()
        return record

    def _report(self) -> None:
        self.done = True
        diffs = []
        diverged_at = None
        exact = True
        for step in sorted(self.seen):
            now, before = float(self.seen[step]), float(self.expected[step])
            if now == before or (math.isnan(now) and math.isnan(before)):
                diffs.append((step, 0.0, 0.0))
                continue
            exact = False
            absolute = abs(now - before)
            relative = absolute / abs(before) if before else math.inf
            diffs.append((step, absolute, relative))
            if diverged_at is None and not absolute <= self.atol + self.rtol * abs(before):
                diverged_at = step
        n = len(self.seen)
        max_abs = max(d[1] for d in diffs)
        max_rel = max(d[2] for d in diffs)
        head = f"Continuity after resume from step {self.resumed_from_step}: first {n} {self.metric} values"
        if exact:
            verdict, level = "exact", "INFO"
            message = f"{head} identical to the superseded run (exact)"
        elif diverged_at is None:
            verdict, level = "within_tolerance", "INFO"
            message = f"{head} within tolerance (max relative difference {max_rel:.3g}, rtol={self.rtol:g})"
        else:
            verdict, level = "diverged", "WARNING"
            message = (
                f"{head} diverged at step {diverged_at}: {self.seen[diverged_at]!r} now, {self.expected[diverged_at]!r} before "
                f"(rtol={self.rtol:g}); consider going back to an earlier checkpoint"
            )
        self.result = {"continuity": verdict, "compared": n, "max_abs_diff": max_abs, "max_rel_diff": max_rel}
        if diverged_at is not None:
            self.result["diverged_at"] = diverged_at
        self.run.writer.emit({"type": EVENT, "step": max(self.seen), "level": level, "source": "flightlog/continuity", "message": message, **self.result})
