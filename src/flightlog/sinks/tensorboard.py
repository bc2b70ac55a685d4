"""The tensorboard sink: the run as TensorBoard event files, written with TensorBoard's own writer.

* metrics records -> scalars ``train/NAME`` and ``eval/NAME`` (``eval_`` prefix), at the
  record's step and wall time; non-numeric fields are skipped, NaN/Infinity are written
  as such. Scalars use the event format's ``simple_value`` (float32), the field
  TensorBoard's scalar dashboard and ``EventAccumulator.Scalars`` read.
* ``run_start`` -> the hyper-parameter config as text (tag ``config``, a JSON block),
  a ``run`` text line (name, task, model, dataset) and an hparams session, so the
  HPARAMS tab lists the run. A resumed segment also writes a ``SessionLog.START`` at
  ``resumed_from_step + 1``: TensorBoard then hides the earlier segment's steps after
  the resume point, as flightlog's own loader hides superseded records.
* ``histograms`` records (see :mod:`flightlog.sinks.histograms`) -> histograms.

Files go to ``tensorboard_dir`` (default ``LOG_DIR/tensorboard``); view them with
``tensorboard --logdir OUTPUT_DIR/logs/tensorboard``. TensorBoard is imported here only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from flightlog.protocol import METRICS, RUN_START
from flightlog.sinks._optional import require
from flightlog.sinks._scalars import flatten, namespaced, record_time, scalar_fields
from flightlog.sinks.base import BaseSink, Record
from flightlog.sinks.histograms import HISTOGRAMS, log_lora_histograms

DEFAULT_SUBDIR = "tensorboard"


class TensorBoardSink(BaseSink):
    """Writes one event file per process segment into ``logdir``."""

    name = "tensorboard"

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        require("tensorboard", "tensorboard", "tensorboard")
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # flush_secs is a fallback only: the writer thread calls flush() every flush interval.
        self._writer = EventFileWriter(str(self.logdir), max_queue_size=1024, flush_secs=30)
        self._step = 0  # for records without a step (they are drawn at the last step seen)
        self.scalars_written = 0
        self._tags: dict[str, str] = {}  # metric name -> tag, computed once

    # ------------------------------------------------------------------ records
    def write(self, batch: list[Record]) -> None:
        """One bad record is skipped, not the rest of the batch; the first problem is raised at the end."""
        problem: Exception | None = None
        for record in batch:
            kind = record.get("type")
            try:
                if kind == METRICS:
                    self._scalars(record)
                elif kind == HISTOGRAMS:
                    self._histograms(record)
                elif kind == RUN_START:
                    self._run_start(record)
            except Exception as exc:
                problem = problem or exc
        if problem is not None:
            raise problem

    def _step_of(self, record: Record) -> int:
        step = record.get("step")
        if type(step) is int:
            self._step = step
            return step
        return self._step

    def _add(self, values: list[Any], step: int, wall_time: float) -> None:
        summary = self._summary_pb2.Summary(value=values)
        self._writer.add_event(self._event_pb2.Event(summary=summary, step=step, wall_time=wall_time))

    def _scalars(self, record: Record) -> None:
        Value = self._summary_pb2.Summary.Value
        tags = self._tags
        values = [
            Value(tag=tags.get(name) or tags.setdefault(name, namespaced(name)), simple_value=value) for name, value in scalar_fields(record)
        ]
        if values:
            self._add(values, self._step_of(record), record_time(record))
            self.scalars_written += len(values)

    def _histograms(self, record: Record) -> None:
        pb = self._summary_pb2
        histograms = record.get(HISTOGRAMS)
        if not isinstance(histograms, dict):
            return
        values = []
        for tag, h in histograms.items():
            try:
                histo = pb.HistogramProto(
                    min=float(h["min"]),
                    max=float(h["max"]),
                    num=float(h["num"]),
                    sum=float(h["sum"]),
                    sum_squares=float(h["sum_squares"]),
                    bucket_limit=[float(x) for x in h["bucket_limit"]],
                    bucket=[float(x) for x in h["bucket"]],
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"histogram {tag!r} at step {record.get('step')} is malformed: {exc!r}") from None
            values.append(pb.Summary.Value(tag=str(tag), histo=histo))
        if values:
            self._add(values, self._step_of(record), record_time(record))

    def _run_start(self, record: Record) -> None:
        from tensorboard.plugins.hparams import summary_v2 as hparams_summary
        from tensorboard.plugins.text import summary_v2 as text_summary

        wall = record_time(record)
        resumed = record.get("resumed_from_step")
        step = resumed + 1 if type(resumed) is int else 0
        if type(resumed) is int:
            log = self._event_pb2.SessionLog(status=self._event_pb2.SessionLog.START)
            self._writer.add_event(self._event_pb2.Event(session_log=log, step=step, wall_time=wall))
        config = record.get("config") or {}
        text = "```json\n" + orjson.dumps(config, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS).decode() + "\n```"
        about = " | ".join(
            f"{key}: {record[key]}" for key in ("run_name", "run_id", "task_type", "model_name", "dataset", "segment") if record.get(key) is not None
        )
        for summary in (text_summary.text_pb("config", text), text_summary.text_pb("run", about)):
            self._writer.add_event(self._event_pb2.Event(summary=summary, step=step, wall_time=wall))
        hparams = flatten(config) if isinstance(config, dict) else {}
        if hparams:
            trial = str(record.get("run_name") or record.get("run_id") or "")
            summary = hparams_summary.hparams_pb(hparams, trial_id=trial, start_time_secs=int(wall))
            self._writer.add_event(self._event_pb2.Event(summary=summary, step=step, wall_time=wall))

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def from_config(config: Any, run_dir: Path) -> TensorBoardSink:
    return TensorBoardSink(config.tensorboard_dir or Path(run_dir) / DEFAULT_SUBDIR)


__all__ = ["TensorBoardSink", "from_config", "log_lora_histograms"]
