"""What every importer shares: the record shapes, skip counting, the follow loop.

An importer turns another tool's log into log-protocol records (dicts with ``type``,
``timestamp``, ``step``, ``epoch`` and fields; no ``run_id``, the consumer adds its own).
The first record is always ``run_start`` with what the source tells about the run; a
source that says the training ended yields ``run_end``. Input it cannot use never
raises: the line or value is skipped, counted per reason in :class:`ImportStats`, and
the first skip of each reason becomes a WARNING ``event`` record naming file and line.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from flightlog.protocol import EVENT, METRICS, RUN_END, RUN_START, format_timestamp

Record = dict[str, Any]


class ImportStats:
    """Counts of what an importer read and what it had to skip, with reasons."""

    def __init__(self) -> None:
        self.records = 0
        self.skipped: Counter[str] = Counter()
        self.dropped_values: Counter[str] = Counter()
        self.first_skip: dict[str, str] = {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "skipped": dict(self.skipped),
            "dropped_values": dict(self.dropped_values),
        }


def metrics_record(step: int | None, epoch: Any, fields: dict[str, Any], t: float | None = None) -> Record:
    record: Record = {"type": METRICS, "timestamp": format_timestamp(time.time() if t is None else t)}
    if step is not None:
        record["step"] = step
    if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch):
        record["epoch"] = epoch
    record.update(fields)
    return record


def number(value: Any) -> float | int | None:
    """A metric value as a number: ints and floats as they are, numeric strings parsed
    (``"2.1"``, ``"NaN"``, ``"9.00%"`` -> 9.0); anything else None (the caller counts it)."""
    cls = value.__class__
    if cls is float or cls is int:
        return value
    if cls is str:
        try:
            return float(value)
        except ValueError:
            try:
                return float(value.strip().rstrip("%"))
            except ValueError:
                return None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    return None


def to_int(value: Any) -> int | None:
    """A step number: a non-negative int, or a float / numeric string holding one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        value = int(value)
    if isinstance(value, int) and value >= 0:
        return value
    return None


class Importer:
    """Base of the file importers: ``records()`` reads what is there, ``follow()`` tails it.

    Subclasses implement ``_start()`` (the run_start record), ``_poll()`` (records that
    arrived since the last call) and optionally ``_drain()`` (records held back waiting
    for more input, given up at the end of a read).
    """

    format = "?"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.stats = ImportStats()
        self.ended = False
        self._pending_events: list[Record] = []

    # ----------------------------------------------------------------- subclass API
    def _start(self) -> Record:
        return {"type": RUN_START, "timestamp": format_timestamp(time.time()), "source_format": self.format, "source_path": str(self.path)}

    def _poll(self) -> list[Record]:
        raise NotImplementedError

    def _drain(self) -> list[Record]:
        return []

    # ----------------------------------------------------------------- helpers
    def warn(self, message: str) -> None:
        """Queue a WARNING event record (shown before the records of the current read)."""
        self._pending_events.append(
            {"type": EVENT, "timestamp": format_timestamp(time.time()), "level": "WARNING", "source": "flightlog/import", "message": message}
        )

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        """Count a skipped line/record; the first of each reason also becomes an event."""
        self.stats.skipped[reason] += 1
        if reason not in self.stats.first_skip:
            message = f"{self.format} importer skipped {where}: {reason}" + (f" ({detail})" if detail else "")
            self.stats.first_skip[reason] = message
            self.warn(message)

    def drop_value(self, key: str, value: Any, where: str) -> None:
        """Count a value that is not a number (the rest of the record is kept)."""
        self.stats.dropped_values[key] += 1
        if self.stats.dropped_values[key] == 1:
            self.warn(f"{self.format} importer dropped the non-numeric value {value!r:.60} of {key!r} at {where}")

    def run_end(self, status: str = "finished", **summary: Any) -> Record:
        self.ended = True
        return {"type": RUN_END, "timestamp": format_timestamp(time.time()), "status": status, "summary": summary}

    def _take(self, records: list[Record]) -> list[Record]:
        if self._pending_events:
            records = self._pending_events + records
            self._pending_events = []
        self.stats.records += sum(1 for r in records if r.get("type") == METRICS)
        return records

    # ----------------------------------------------------------------- public API
    def records(self) -> Iterator[Record]:
        """Everything the source holds now (a torn last line is skipped and counted)."""
        yield self._start()
        yield from self._take(self._poll())
        yield from self._take(self._drain())

    def follow(
        self,
        *,
        poll_interval: float = 0.5,
        stop: threading.Event | Callable[[], bool] | None = None,
        idle_timeout: float | None = None,
    ) -> Iterator[Record]:
        """Read what is there, then keep reading what is appended until the source says
        the run ended, ``stop`` is set, or nothing new came for ``idle_timeout`` seconds.

        A line still being written is held until its newline arrives; when following
        ends, a held line is parsed if it is complete, else skipped and counted.
        """
        stopped: Callable[[], bool]
        if stop is None:
            stopped = lambda: False  # noqa: E731
        elif isinstance(stop, threading.Event):
            stopped = stop.is_set
        else:
            stopped = stop
        yield self._start()
        last_data = time.monotonic()
        while True:
            # Decide before reading: the read after the trainer stopped is the last one,
            # so lines written just before it exited are not lost.
            stopping = stopped()
            idle = idle_timeout is not None and time.monotonic() - last_data >= idle_timeout
            batch = self._take(self._poll())
            if batch:
                last_data = time.monotonic()
                yield from batch
            if self.ended or stopping or (idle and not batch):
                break
            if isinstance(stop, threading.Event):
                stop.wait(poll_interval)
            else:
                time.sleep(poll_interval)
        yield from self._take(self._drain())
