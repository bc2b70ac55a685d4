"""Straggler detection from the per-rank figures gathered at each logging step.

A rank's step time is the time it spent between flightlog's previous collective and
this one, per step: every rank leaves a collective together, so the rank that arrives
last is the one whose work took longest. The record carries the slowest rank and its
lag behind the others' median; an alert fires when the same rank lags by more than
``margin`` for ``patience`` logging steps in a row, or at once when a rank reports an
earlier step than the others (one step behind: the seeds' rank 3 before an OOM).
Pure Python, so it is tested without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Sequence


@dataclass
class Finding:
    """What the detector adds to the record, and the alerts it raises (rule, message, fields)."""

    fields: dict[str, Any] = field(default_factory=dict)
    alerts: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


class StragglerDetector:
    def __init__(self, margin: float = 0.2, patience: int = 3) -> None:
        if not margin > 0:
            raise ValueError(f"flightlog: straggler_margin must be > 0, got {margin!r}")
        if type(patience) is not int or patience < 1:
            raise ValueError(f"flightlog: straggler_patience must be an integer >= 1, got {patience!r}")
        self.margin = margin
        self.patience = patience
        self._candidate: int | None = None
        self._streak = 0
        self._alerted: int | None = None  # rank already alerted for, until it recovers
        self._behind: tuple[int, ...] = ()

    def update(self, steps: Sequence[float], step_times: Sequence[float], memory_mb: Sequence[float] = ()) -> Finding:
        """``steps[r]``, ``step_times[r]`` (seconds, NaN when unknown), ``memory_mb[r]`` per rank."""
        found = Finding()
        world = len(steps)
        if memory_mb:
            finite = [(m, r) for r, m in enumerate(memory_mb) if math.isfinite(m)]
            if finite:
                peak, rank = max(finite)
                found.fields["peak_memory_mb"] = round(peak, 1)
                found.fields["peak_memory_rank"] = rank
        self._check_behind(steps, found)
        times = [(t, r) for r, t in enumerate(step_times) if math.isfinite(t)]
        if world < 2 or len(times) < 2:
            return found
        slow_time, slow = max(times)
        others = median(t for t, r in times if r != slow)
        lag = slow_time - others
        found.fields["slowest_rank"] = slow
        found.fields["slowest_rank_lag_s"] = round(lag, 6)
        lagging = others > 0 and lag > self.margin * others or others == 0 and lag > 0
        if not lagging:
            self._candidate, self._streak = None, 0
            self._alerted = None
            return found
        if slow == self._candidate:
            self._streak += 1
        else:
            self._candidate, self._streak = slow, 1
        if self._streak >= self.patience and self._alerted != slow:
            self._alerted = slow
            ratio = lag / others if others > 0 else math.inf
            found.alerts.append((
                "straggler",
                f"rank {slow} is a straggler: its steps took {slow_time:.3f}s against a median of {others:.3f}s "
                f"on the other ranks ({ratio:.0%} slower) for {self._streak} logging steps in a row",
                {"rank": slow, "value": round(ratio, 4), "threshold": self.margin, "lag_s": round(lag, 6)},
            ))
        return found

    def _check_behind(self, steps: Sequence[float], found: Finding) -> None:
        finite = [s for s in steps if math.isfinite(s)]
        if len(finite) < 2:
            return
        lead = max(finite)
        behind = tuple(r for r, s in enumerate(steps) if math.isfinite(s) and s < lead)
        if behind and behind != self._behind:
            gaps = ", ".join(f"rank {r} at step {int(steps[r])}" for r in behind)
            found.alerts.append((
                "rank_behind",
                f"ranks disagree on the step: {gaps} while the others are at step {int(lead)}",
                {"ranks": list(behind), "value": int(lead - min(steps[r] for r in behind)), "threshold": 0},
            ))
        self._behind = behind
