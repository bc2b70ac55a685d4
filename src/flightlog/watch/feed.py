"""Feeding imported records into a flightlog :class:`~flightlog.run.Run`.

The importers speak the log protocol already; this is the small adapter that makes a
Run from the first ``run_start`` and hands every later record to the Run's pipeline
(processors such as the rules engine, then the sinks), so a watched run is recorded,
shown and diagnosed exactly like one that calls ``flightlog.log`` itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

from flightlog.pipeline.processors import Processor
from flightlog.protocol import ALERT, CHECKPOINT, ENVELOPE, EVENT, METRICS, RUN_END, RUN_START
from flightlog.run import Run, init
from flightlog.runfile import read_run_file
from flightlog.sinks.console import ConsoleSink

# A factory gets the Run (to reach ``run.writer.emit``) and returns a processor.
ProcessorFactory = Callable[[Run], Processor]
_START_KEYS = ("run_name", "task_type", "model_name", "dataset", "max_steps")
_DROP = frozenset(ENVELOPE) | {"source_format", "source_path"}


class RunFeeder:
    """Creates the Run at the first ``run_start`` and feeds it the records that follow."""

    def __init__(
        self,
        *,
        output_dir: str | os.PathLike[str],
        log_dir: str | os.PathLike[str],
        sinks: list[Any],
        processors: Iterable[ProcessorFactory] = (),
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.log_dir = Path(log_dir)
        self.sinks = sinks
        self.factories = list(processors)
        self.run_name = run_name
        self.config = dict(config or {})
        self.options = dict(options or {})  # more init() settings (rules, notify)
        self.run: Run | None = None
        self.end: dict[str, Any] | None = None
        self.metrics = 0

    def start(self, record: dict[str, Any]) -> Run:
        options: dict[str, Any] = {k: record[k] for k in _START_KEYS if record.get(k) is not None}
        if self.run_name:
            options["run_name"] = self.run_name
        config = {**(record.get("config") or {}), **self.config}
        source = {k: record[k] for k in ("source_format", "source_path") if record.get(k)}
        if source:
            config["imported_from"] = source
        # Watching the same output again re-imports it from the start: the new segment
        # supersedes what the earlier watch recorded instead of doubling it.
        resumed = 0 if read_run_file(self.log_dir) else None
        self.run = init(
            output_dir=str(self.output_dir),
            log_dir=str(self.log_dir),
            sinks=self.sinks,
            config=config,
            resumed_from_step=resumed,
            install_signal_handlers=False,
            **{**self.options, **options},
        )
        for factory in self.factories:
            self.run.add_processor(factory(self.run))
        return self.run

    def set_max_steps(self, max_steps: int | None) -> None:
        if not max_steps or self.run is None:
            return
        for sink in self.run.sinks:
            if isinstance(sink, ConsoleSink) and not sink.max_steps:
                sink.max_steps = max_steps

    def feed(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == RUN_START:
            if self.run is None:
                self.start(record)
            elif record.get("segment"):
                run = self.run
                run.record(RUN_START, segment=run.segment + int(record["segment"]), resumed_from_step=record.get("resumed_from_step"), run_name=run.run_name)
            return
        run = self.run if self.run is not None else self.start({})
        if kind == RUN_END:
            self.end = record
            return
        fields = {k: v for k, v in record.items() if k not in _DROP}
        if kind == METRICS:
            self.metrics += 1
        elif kind == EVENT:
            if record.get("timestamp"):
                fields["source_timestamp"] = record["timestamp"]
        elif kind not in (ALERT, CHECKPOINT):
            return
        run.record(kind, step=record.get("step"), epoch=record.get("epoch"), **fields)

    def finish(self, status: str, summary: dict[str, Any] | None = None) -> None:
        run = self.run if self.run is not None else self.start({})
        final = dict((self.end or {}).get("summary") or {})
        final.update(summary or {})
        run.finish(status, summary=final)
