"""The writer thread: drain the queue, finish records, hand batches to the sinks.

Everything that costs time happens here, never on the training thread: formatting
timestamps, resolving tensors (waiting on CUDA events with the GIL released),
processors, redaction, rules, JSON encoding and I/O. Records are processed in small
chunks so that the thread gives the GIL back often (a single C call encoding a huge
batch would stall the training thread for a whole switch interval).

A failing sink or processor never stops the thread: failures are counted, and
reported as ``event`` records (rate-limited) through the sinks that still work.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from itertools import chain, compress, repeat
from operator import itemgetter, mul
from typing import Any, Callable, Iterable, Sequence

from flightlog.pipeline.processors import DropRecord, Processor, Record
from flightlog.pipeline.queue import BUILT_METRICS, PLAIN_METRICS, RecordQueue
from flightlog.pipeline.summary import SummaryTracker
from flightlog.protocol import EVENT, METRICS, NONFINITE_STRINGS, format_timestamp
from flightlog.sinks.base import Sink
from flightlog.values import _NUMBER_TYPES, finite_numbers, finite_sum, resolve_record, resolve_value

# Records finished per pass (a pass of 128 plain records takes ~0.3 ms here; twice that
# many saved only 0.3% more per record). Left to itself CPython only takes the GIL from a
# busy thread after the 5 ms switch interval, so the writer gives the GIL away (sleep(0))
# once it has worked YIELD_AFTER seconds without a pause: a training thread waits at most
# about that long plus one pass. sleep(0) costs ~55 µs of wall time here (the kernel's
# timer slack), which a pause after every pass would waste when nobody is waiting.
CHUNK = 128
YIELD_AFTER = 0.0005
ERROR_REPORT_INTERVAL = 60.0  # seconds between repeated reports of the same failure

# A queued item: (type, unix time, step, epoch, fields).
Item = tuple[str, float, Any, Any, dict[str, Any]]
_flatten = chain.from_iterable
_kind = itemgetter(0)
_STR = frozenset({str})
_SCALAR_TYPES = _NUMBER_TYPES | {str, type(None)}
_NO_KEYS: frozenset[Any] = frozenset()


def _scalar_text_keys(dicts: Sequence[dict[str, Any]]) -> set[Any] | None:
    """The keys holding strings, when every value is a finite number, None or a string;
    else None. C-level passes over all the values at once."""
    values = list(_flatten(map(dict.values, dicts)))
    types = list(map(type, values))
    if _NUMBER_TYPES.issuperset(types):
        numbers: Any = values
        text_keys: set[Any] = set()
    elif _SCALAR_TYPES.issuperset(types):
        text_keys = set(compress(_flatten(dicts), map(_STR.__contains__, types)))
        numbers = list(compress(values, map(_NUMBER_TYPES.__contains__, types)))
    else:
        return None
    if not finite_sum(numbers):
        return None  # NaN or infinity (protocol strings), or an integer beyond the float range: one by one
    return text_keys


class Writer:
    """Owns the sinks; all their methods are called from this thread only."""

    def __init__(
        self,
        queue: RecordQueue,
        sinks: Iterable[Sink],
        *,
        run_id: str,
        processors: Iterable[Processor] = (),
        redactor: Processor | None = None,
        observers: Iterable[Processor] = (),
        summary: SummaryTracker | None = None,
        flush_interval: float = 1.0,
        heartbeat: Callable[["Writer"], None] | None = None,
        heartbeat_interval: float = 10.0,
        name: str = "flightlog-writer",
    ) -> None:
        self.queue = queue
        self.sinks: list[Sink] = list(sinks)
        self.run_id = run_id
        # The chain: user processors -> redactor -> observers (rules...) -> summary -> sinks.
        self.processors: list[Processor] = list(processors)
        self.redactor = redactor
        self.observers: list[Processor] = list(observers)
        self.summary = summary if summary is not None else SummaryTracker()
        self.flush_interval = flush_interval
        self.heartbeat = heartbeat
        self.heartbeat_interval = heartbeat_interval
        # Counters, read by the run for run.json and tests.
        self.records_written = 0
        self.sink_failures: dict[str, int] = {}
        self.processor_failures: dict[str, int] = {}
        self.rejected_values = 0
        self.last_write_time: float | None = None
        # Extra records emitted while processing (alerts from rules, failure events).
        self._emitted: list[Record] = []
        self._last_report: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._flush_lock = threading.Condition()
        self._flush_requested = 0
        self._flush_done = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed_sinks = False
        self._closed_ids: set[int] = set()

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until everything queued before this call is written and flushed."""
        if not self._thread.is_alive():
            return False
        with self._flush_lock:
            self._flush_requested += 1
            ticket = self._flush_requested
            self.queue.wake.set()
            return self._flush_lock.wait_for(lambda: self._flush_done >= ticket, timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Drain, flush and close every sink; returns False if the thread did not finish in time."""
        self._stop.set()
        self.queue.wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def emit(self, record: Record) -> None:
        """Add a finished record (e.g. an alert) to the batch being processed (writer thread)."""
        record.setdefault("timestamp", format_timestamp(time.time()))
        record.setdefault("run_id", self.run_id)
        self._emitted.append(record)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        queue = self.queue
        next_flush = time.monotonic() + self.flush_interval
        next_beat = time.monotonic() + self.heartbeat_interval
        while True:
            stopping = self._stop.is_set()
            timeout = max(0.0, next_flush - time.monotonic())
            if not stopping:
                queue.wake.wait(timeout)
                queue.wake.clear()
            try:
                self._drain()
                now = time.monotonic()
                flush_wanted = self._flush_requested > self._flush_done
                if now >= next_flush or flush_wanted or self._stop.is_set():
                    # Requests made up to here are covered by this flush.
                    ticket = self._flush_requested
                    self._flush_sinks()
                    next_flush = now + self.flush_interval
                    with self._flush_lock:
                        self._flush_done = ticket
                        self._flush_lock.notify_all()
                if self.heartbeat is not None and now >= next_beat:
                    next_beat = now + self.heartbeat_interval
                    self._call_heartbeat()
            except Exception:  # never let the thread die
                self._report("writer", "internal", "".join(traceback.format_exc(limit=5)))
            if self._stop.is_set() and len(queue) == 0 and not self._emitted:
                break
        self._close_sinks()
        with self._flush_lock:
            self._flush_done = self._flush_requested
            self._flush_lock.notify_all()

    def _drain(self) -> None:
        queue = self.queue
        clock = time.perf_counter
        started = clock()
        while True:
            items = queue.drain(CHUNK)
            if not items and not self._emitted:
                return
            if BUILT_METRICS in map(_kind, items):
                self._build(items)
            batch = self._finish(items)
            if batch:
                self._write(batch)
            if clock() - started >= YIELD_AFTER:
                time.sleep(0)  # let a waiting training thread run (see CHUNK)
                started = clock()

    def _build(self, items: list[Item]) -> None:
        """Turn the chunk's ``BUILT_METRICS`` items into metrics items, in place, one call
        per build function. A build that fails keeps the loop's own metrics of its records
        (``args[0]``) and is reported; nothing else is lost."""
        by_build: dict[Any, list[int]] = {}
        for i, item in enumerate(items):
            if item[0] == BUILT_METRICS:
                by_build.setdefault(item[4][0], []).append(i)
        for build, indexes in by_build.items():
            args = [items[i][4][1] for i in indexes]
            try:
                built = build(args)
            except Exception:
                built = [self._build_one(build, a) for a in args]
            for i, fields in zip(indexes, built):
                _, t, step, epoch, _ = items[i]
                items[i] = (METRICS, t, step, epoch, fields)

    def _build_one(self, build: Callable[[list[tuple[Any, ...]]], list[dict[str, Any]]], args: tuple[Any, ...]) -> dict[str, Any]:
        try:
            return build([args])[0]
        except Exception as exc:
            self._report("writer", f"build:{type(exc).__name__}", f"could not put together a metrics record ({type(exc).__name__}: {exc}); its logged metrics were kept, the fields flightlog adds were dropped")
            return args[0]

    def _finish(self, items: list[Item]) -> list[Record]:
        try:
            if items and not self._emitted:
                batch = self._finish_chunk(items)
                if batch is not None:
                    return batch
            return self._finish_each(items)
        except Exception:
            return self._finish_alone(items)

    def _finish_alone(self, items: list[Item]) -> list[Record]:
        """A failure none of the stages caught (a flightlog bug): each item is finished on
        its own, so only the record that cannot be finished is lost, and reported."""
        out: list[Record] = []
        for item in items:
            try:
                out.extend(self._finish_each([item]))
            except Exception as exc:
                kind, step = item[0], item[2]
                self._report("writer", type(exc).__name__, f"could not write a {kind!r} record (step {step}): {type(exc).__name__}: {exc}; that record was dropped, the others kept")
        return out

    def _finish_chunk(self, items: list[Item]) -> list[Record] | None:
        """The common chunk, finished with C-level passes over the whole chunk: metrics
        records, all with or all without an epoch, whose values are (or resolve to) finite
        numbers, None, and strings the redactor leaves alone (``stage``, ``precision``).
        None when the chunk is not like that (nothing is changed then, but for tensors
        already resolved in place); ``_finish_each`` takes it. Processors and observers
        still see each record; the redactor runs only if a processor added text it reads.
        """
        n = len(items)
        kinds, times, steps, epochs, fields = zip(*items)  # one C call: a tuple per part
        checked = kinds.count(PLAIN_METRICS)
        if (checked != n and checked + kinds.count(METRICS) != n) or steps.count(None):
            return None
        missing = epochs.count(None)
        if missing == n:
            with_epoch = False
        elif missing == 0 and finite_numbers(epochs):
            with_epoch = True
        else:
            return None  # an epoch on some records only, or one that is not a finite number
        values = _flatten(map(dict.values, fields))
        # The usual chunk: finite numbers only (their types already checked by Run.log when
        # every item says so).
        if finite_sum(values) if checked == n else finite_numbers(list(values)):
            text_keys: set[Any] | None = _NO_KEYS
        else:
            text_keys = _scalar_text_keys(fields)
        if text_keys is None:  # tensors, numpy numbers...: resolve them in place, then look again
            problems: list[str] = []
            for values in fields:
                resolve_record(values, problems)
            if problems:
                self._values_rejected(problems)
                return None  # record by record, so the report follows its record
            text_keys = _scalar_text_keys(fields)
            if text_keys is None:
                return None
        redactor = self.redactor
        if text_keys and redactor is not None and not redactor.leaves_alone(text_keys, _flatten(fields)):
            return None
        stamps = map(format_timestamp.__getitem__, map(int, map(mul, times, repeat(1000.0))))
        run_id = self.run_id
        if not with_epoch:
            records = [{"type": METRICS, "timestamp": ts, "run_id": run_id, "step": step, **f} for ts, step, f in zip(stamps, steps, fields)]
        else:
            records = [
                {"type": METRICS, "timestamp": ts, "run_id": run_id, "step": step, "epoch": epoch, **f}
                for ts, step, epoch, f in zip(stamps, steps, epochs, fields)
            ]
        if not self.processors and not self.observers:
            self.summary.observe_batch(fields, steps)
            return records
        return self._stages_each(records)

    def _stages_each(self, records: list[Record]) -> list[Record]:
        """Processors, then (if they added text it reads) the redactor, then observers, per
        record; what the stages emit lands right after its record, as in ``_finish_each``."""
        after: dict[int, list[Record]] = {}
        if self.processors:
            kept: list[Record] = []
            for record in records:
                result = self._apply(record, self.processors)
                if result is not None:
                    kept.append(result)
                if self._emitted:
                    after.setdefault(len(kept) - 1, []).extend(self._take_emitted())
            records = kept
            redactor = self.redactor
            if redactor is not None:
                text_keys = _scalar_text_keys(records)
                if text_keys is None or not redactor.leaves_alone(text_keys, _flatten(records)):
                    for record in records:
                        redactor(record)
        out: list[Record] = list(after.get(-1, ()))
        observed: list[Record] = []
        observers = self.observers
        for i, record in enumerate(records):
            result = self._apply(record, observers) if observers else record
            if result is not None:
                out.append(result)
                if result.get("type") == METRICS:
                    observed.append(result)
            if i in after:
                out.extend(after[i])
            if self._emitted:
                out.extend(self._take_emitted())
        self.summary.observe_batch(observed)
        return out

    def _finish_each(self, items: list[Item]) -> list[Record]:
        run_id = self.run_id
        fmt = format_timestamp
        out: list[Record] = []
        problems: list[str] = []
        observed: list[Record] = []  # metrics records for the summary, in order
        plain_chain = not self.processors and not self.observers
        for kind, t, step, epoch, fields in items:
            if kind == PLAIN_METRICS:
                kind = METRICS
            if finite_numbers(fields.values()):
                has_text = False  # finite numbers only: nothing to resolve
            else:
                has_text = resolve_record(fields, problems)
                if problems:
                    self._values_rejected(problems)
            record: Record = {"type": kind, "timestamp": fmt(t), "run_id": run_id}
            if step is not None:
                record["step"] = step
            if epoch is not None and (type(epoch) is not float or epoch - epoch != 0.0):
                epoch = self._epoch_value(epoch)
            if epoch is not None:
                record["epoch"] = epoch
            record.update(fields)
            if kind == METRICS and not has_text and plain_chain:
                observed.append(record)  # the common case: numbers only, nothing to redact
                out.append(record)
            else:
                kept = self._stages(record, has_text or kind != METRICS)
                if kept is not None:
                    out.append(kept)
                    if kept.get("type") == METRICS:
                        observed.append(kept)
            if self._emitted:
                out.extend(self._take_emitted())
        if self._emitted:
            out.extend(self._take_emitted())
        self.summary.observe_batch(observed)
        return out

    def _stages(self, record: Record, may_hold_text: bool, emitted: bool = False) -> Record | None:
        """Processors, redaction (only where there is text to redact), observers."""
        processors = self.processors
        if processors:
            record = self._apply(record, processors)  # type: ignore[assignment]
            if record is None:
                return None
            may_hold_text = True  # a processor may have added text
        if self.redactor is not None and may_hold_text:
            self.redactor(record)
        if self.observers and not emitted:
            record = self._apply(record, self.observers)  # type: ignore[assignment]
            if record is None:
                return None
        return record

    def _epoch_value(self, epoch: Any) -> Any:
        """An epoch that is not a finite float: a number of another kind (numpy, a 0-d
        tensor, an int) as its value, a non-finite one as the protocol's string; anything
        else is refused by name (the record is kept without it), never handed to a sink
        that could not encode it."""
        try:
            value = resolve_value(epoch, "epoch")
        except Exception as exc:  # UnsupportedValue, a tensor whose copy failed...
            self._values_rejected([f"epoch: could not be read ({type(exc).__name__}: {exc})"])
            return None
        if type(value) in (int, float) or value in NONFINITE_STRINGS:
            return value
        self._values_rejected([f"epoch: must be a number, got {epoch!r} ({type(epoch).__name__})"])
        return None

    def _values_rejected(self, problems: list[str]) -> None:
        self.rejected_values += len(problems)
        for message in problems:
            self._report("values", message.split(":")[0], message + " (value dropped; the rest of the record was kept)")
        problems.clear()

    def _take_emitted(self) -> list[Record]:
        emitted, self._emitted = self._emitted, []
        result = []
        for record in emitted:
            resolve_record(record, [])
            kept = self._stages(record, True, emitted=True)
            if kept is not None:
                result.append(kept)
        return result

    def _apply(self, record: Record, processors: list[Processor]) -> Record | None:
        for processor in processors:
            try:
                result = processor(record)
            except DropRecord:
                return None
            except Exception as exc:
                name = getattr(processor, "__name__", type(processor).__name__)
                self.processor_failures[name] = self.processor_failures.get(name, 0) + 1
                self._report(f"processor {name}", type(exc).__name__, f"processor {name} failed: {type(exc).__name__}: {exc}; skipped it for this record")
                continue
            if result is None:
                return None
            record = result
        return record

    def _write(self, batch: list[Record]) -> None:
        for sink in self.sinks:
            if self._closed_ids and id(sink) in self._closed_ids:
                continue
            try:
                sink.write(batch)
            except Exception as exc:
                self._sink_failed(sink, "write", exc)
        self.records_written += len(batch)
        self.last_write_time = time.time()

    def _flush_sinks(self) -> None:
        for sink in self.sinks:
            try:
                sink.flush()
            except Exception as exc:
                self._sink_failed(sink, "flush", exc)

    def _close_sinks(self) -> None:
        if self._closed_sinks:
            return
        self._closed_sinks = True
        # Failure events from the last flush still need writing before closing.
        try:
            self._drain()
        except Exception:
            pass
        # Last sink first: the first one (train.jsonl) closes last, so it still records
        # the others' close failures; a closed sink gets no more writes.
        for sink in reversed(self.sinks):
            self._closed_ids.add(id(sink))
            try:
                sink.close()
            except Exception as exc:
                self._sink_failed(sink, "close", exc)
                try:
                    self._drain()
                except Exception:
                    pass

    def _call_heartbeat(self) -> None:
        try:
            self.heartbeat(self)  # type: ignore[misc]
        except Exception as exc:
            self._report("heartbeat", type(exc).__name__, f"could not update run.json: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ failures
    def _sink_failed(self, sink: Sink, what: str, exc: BaseException) -> None:
        name = getattr(sink, "name", type(sink).__name__)
        self.sink_failures[name] = self.sink_failures.get(name, 0) + 1
        detail = f"{type(exc).__name__}: {exc}"
        self._report(
            f"sink {name}",
            type(exc).__name__,
            f"sink {name!r} failed to {what} ({detail}); training continues, "
            f"{self.sink_failures[name]} failure(s) so far",
        )

    def _report(self, source: str, kind: str, message: str) -> None:
        """Record a failure as an event, at most once a minute per (source, kind)."""
        now = time.monotonic()
        key = (source, kind)
        last = self._last_report.get(key)
        if last is not None and now - last < ERROR_REPORT_INTERVAL:
            return
        self._last_report[key] = now
        print(f"flightlog: {message}", file=sys.stderr)
        self._emitted.append(
            {
                "type": EVENT,
                "timestamp": format_timestamp(time.time()),
                "run_id": self.run_id,
                "level": "ERROR" if source != "values" else "WARNING",
                "source": f"flightlog/{source}",
                "message": message,
            }
        )
