"""Stall detection: no new step for k x the median step time.

A stuck training thread cannot report that it is stuck, so this is watched by a timer
thread of its own. :class:`StallWatch` is the pure logic (feed it step times, ask it
at a given time), used by the live timer, by ``flightlog doctor`` on recorded
timestamps and by the benchmark on simulated clocks.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from statistics import median
from typing import Callable

from flightlog.rules.advice import advice_for
from flightlog.rules.config import StallConfig
from flightlog.rules.detectors import Finding


class StallWatch:
    """Remembers when the last steps arrived; says when the silence is too long.

    ``observe`` runs for every record on the writer thread, ``check`` on the timer
    thread, without a lock: each attribute has one writer. ``observe`` owns the step
    times and counts the steps it saw (``_steps``); ``check`` owns ``_alerted_at``, the
    count at which it reported a stall (so "already reported" ends with the next step).
    The one race left is a stall reported just as the step that ends it arrives: the
    alert stands and that step carries no recovery note.
    """

    def __init__(self, config: StallConfig | None = None) -> None:
        self.config = config or StallConfig()
        self._intervals: deque[float] = deque(maxlen=self.config.window)
        self._last_time: float | None = None
        self._last_step: int | None = None
        self._steps = 0
        self._alerted_at = -1
        self._longest = 0.0

    def observe(self, step: int | None, t: float) -> Finding | None:
        """A new step arrived at time ``t``; returns a recovery note if a stall had been reported."""
        last_step = self._last_step
        if last_step is not None and step is not None and step <= last_step:
            return None  # same step again (eval record) or a resume: no progress
        last = self._last_time
        recovered = None
        if last is not None:
            if self._alerted_at == self._steps:
                gap = t - last
                recovered = Finding("stall", "info", f"training resumed at step {step} after {gap:.0f}s without a step",
                                    step, gap, None, "", "stall:recovered")
            elif t > last:
                gap = t - last
                self._intervals.append(gap)
                if gap > self._longest:
                    self._longest = gap
        self._last_time, self._last_step = t, step
        self._steps += 1
        return recovered

    def limit(self) -> float | None:
        """Seconds of silence that count as a stall (None until enough steps were seen)."""
        c = self.config
        if len(self._intervals) < c.min_intervals:
            return None
        return max(c.min_seconds, c.factor * median(self._intervals), c.pause_factor * self._longest)

    def check(self, now: float) -> Finding | None:
        """A stall finding if the last step is older than the limit (once per stall)."""
        steps = self._steps
        last_time, last_step = self._last_time, self._last_step
        if self._alerted_at == steps or last_time is None:
            return None
        limit = self.limit()
        if limit is None:
            return None
        silent = now - last_time
        if silent <= limit:
            return None
        self._alerted_at = steps
        usual = median(self._intervals)
        return Finding(
            "stall", self.config.severity,
            f"no new step for {silent:.0f}s after step {last_step} "
            f"(usually {usual:.3g}s between steps; limit {limit:.0f}s)",
            last_step, round(silent, 3), round(limit, 3), advice_for("stall").action, "stall",
        )


class StallTimer:
    """A daemon thread that asks a :class:`StallWatch` every ``check_interval`` seconds."""

    def __init__(self, watch: StallWatch, report: Callable[[Finding], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.watch = watch
        self.report = report
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flightlog-stall", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        interval = self.watch.config.check_interval
        while not self._stop.wait(interval):
            try:
                finding = self.watch.check(self.clock())
                if finding is not None:
                    self.report(finding)
            except Exception:  # a watchdog must never die of its own bug
                pass
