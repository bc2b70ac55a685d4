"""The public API: ``init`` a run, ``log`` metrics, record ``event``s, ``finish``.

``Run.log`` is the training loop's only contact with flightlog and does as little as
possible: decide whether the step is kept (``logging_steps``), copy the metrics dict,
start the host copy of any device tensor, and append one tuple to a deque. Everything
else happens on the writer thread (see :mod:`flightlog.pipeline.writer`).
"""

from __future__ import annotations

import atexit
import math
import os
import secrets
import signal
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from flightlog.config import Config, ConfigError, build_config
from flightlog.pipeline.processors import Processor
from flightlog.pipeline.queue import BUILT_METRICS, PLAIN_METRICS, RecordQueue
from flightlog.pipeline.summary import SummaryTracker
from flightlog.pipeline.writer import Writer
from flightlog.protocol import (
    ALERT,
    CHECKPOINT,
    CHECKPOINT_STATUSES,
    EVENT,
    LEVEL_NUMBERS,
    LEVELS,
    METRICS,
    RUN_END,
    RUN_START,
    RUN_STATUSES,
    SCHEMA_VERSION,
    format_timestamp,
    has_eval_metrics,
)
from flightlog.redact import Redactor
from flightlog.runfile import RunFile, read_run_file
from flightlog.sinks import build_sinks
from flightlog.values import PLAIN_TYPES as _PLAIN, snapshot, snapshot_in_place

OnLogHook = Callable[[dict[str, Any], int], Any]

_time = time.time
_current: "Run | None" = None
_exit_status: str | None = None  # set by our excepthook when the program dies of an exception


def new_run_id() -> str:
    """Time-ordered and unique: ``20261130-012447-a1b2c3``."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _caller(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class Run:
    """One training run (one process segment of it). Create with :func:`flightlog.init`."""

    def __init__(
        self,
        config: Config,
        *,
        processors: Iterable[Processor] = (),
        on_log: Iterable[OnLogHook] = (),
    ) -> None:
        self.config = config
        self.log_dir: Path = config.resolved_log_dir
        self.output_dir = Path(config.output_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)

        previous = self._read_previous()
        if previous and config.run_id and previous.get("run_id") != config.run_id:
            raise ConfigError(
                f"flightlog config: log_dir {str(self.log_dir)!r} already holds run {previous.get('run_id')!r}; "
                f"pass run_id={previous.get('run_id')!r} to continue it, or choose another output_dir/log_dir"
            )
        self.run_id: str = config.run_id or (previous or {}).get("run_id") or new_run_id()
        self.segment: int = int(previous.get("segment", -1)) + 1 if previous else 0
        self.run_name: str = config.run_name or (previous or {}).get("run_name") or self.output_dir.resolve().name
        self.resumed_from_step = config.resumed_from_step

        # --- thinning, decided once
        self._stride = config.logging_steps
        self._epoch_cap = config.max_logging_steps_per_epoch
        if self._epoch_cap and config.steps_per_epoch:
            self._stride = max(self._stride, math.ceil(config.steps_per_epoch / self._epoch_cap))
            self._epoch_cap = None
        self._thinning = self._stride > 1 or self._epoch_cap is not None
        self._epoch_seen: int | None = None
        self._epoch_count = 0
        self._next_step = (config.resumed_from_step or 0) + 1
        self._level = config.level_number
        self._hooks: list[OnLogHook] = list(on_log)

        # --- pipeline
        self.summary = SummaryTracker()
        self._redactor = Redactor(config.redact_drop, config.redact_hash) if (
            config.redact or config.redact_drop or config.redact_hash
        ) else None
        self.queue = RecordQueue(config.queue_size, config.on_full)
        self._items = self.queue._items
        self._maxsize = config.queue_size
        self.sinks = build_sinks(config.sinks, config, self.log_dir)
        self.writer = Writer(
            self.queue,
            self.sinks,
            run_id=self.run_id,
            processors=processors,
            redactor=self._redactor,
            summary=self.summary,
            flush_interval=config.flush_interval,
            heartbeat=self._heartbeat,
            heartbeat_interval=min(config.heartbeat_interval, 60.0),
        )
        # --- diagnosis rules (writer-thread processor + stall timer); see flightlog.rules.actions
        self.should_stop = False
        self.stop_reason: str | None = None
        self.rules = None
        if config.rules is not False:
            from flightlog.rules import attach

            self.rules = attach(self)

        from flightlog import context

        # Integrations that write a checkpoint record for every save they see ("hf"), so
        # that another one watching the same saves does not write it twice.
        self.save_recorders: set[str] = set()
        self.context = {
            "hardware": context.hardware_info(),
            "code": context.code_version(),
            "launch": context.launch_command(),
            "versions": context.versions(),
        }
        self.start_time = format_timestamp(_time())
        meta = {
            "run_id": self.run_id,
            "run_name": self.run_name,
            "task_type": config.task_type,
            "model_name": config.model_name,
            "dataset": config.dataset,
            "output_dir": str(self.output_dir.resolve()),
            "log_dir": str(self.log_dir.resolve()),
            "status": "running",
            "start_time": (previous or {}).get("start_time", self.start_time),
            "segment_start_time": self.start_time,
            "end_time": None,
            "segment": self.segment,
            "resumed_from_step": config.resumed_from_step,
            "pid": os.getpid(),
            "heartbeat_interval": config.heartbeat_interval,
            "max_steps": config.max_steps,
            "config": dict(config.config),
            **self.context,
        }
        if self._redactor is not None:
            meta = self._redactor.redact_nested(meta)
        self.run_file = self._open_run_file(meta)
        self.run_file.update(fsync=True)
        self._update_index({})

        self._finished = False
        self._finish_lock = threading.Lock()
        self._warned_after_finish = False
        self.writer.start()
        self.record(
            RUN_START,
            schema_version=SCHEMA_VERSION,
            run_name=self.run_name,
            task_type=config.task_type,
            model_name=config.model_name,
            dataset=config.dataset,
            output_dir=meta["output_dir"],
            log_dir=meta["log_dir"],
            segment=self.segment,
            resumed_from_step=config.resumed_from_step,
            max_steps=config.max_steps,
            logging_steps=config.logging_steps,
            config=dict(config.config),
            **self.context,
        )
        self._signal_handlers: dict[int, Any] = {}
        if config.install_signal_handlers:
            self._install_signal_handlers()
        atexit.register(self._at_exit)

    def _read_previous(self) -> dict[str, Any] | None:
        """The run.json already in the log directory (a distributed follower gets rank 0's instead)."""
        return read_run_file(self.log_dir)

    def _open_run_file(self, meta: dict[str, Any]) -> RunFile:
        """The writer of run.json (a distributed follower gets one that writes nothing)."""
        return RunFile(self.log_dir, meta)

    # ------------------------------------------------------------------ hot path
    def log(self, metrics: Mapping[str, Any], step: int | None = None, epoch: float | None = None) -> None:
        """Record metrics for a step. Only enqueues: no I/O, no encoding, no device sync.

        ``step`` defaults to the previous step + 1. With ``logging_steps=N`` only steps
        that are multiples of N are kept (records with ``eval_`` metrics always are).
        """
        if step is None:
            step = self._next_step
        elif type(step) is not int:
            step = self._coerce_step(step)
        self._next_step = step + 1
        if self._thinning and not self._keep(step, epoch, metrics):
            return
        if type(metrics) is not dict:
            if not isinstance(metrics, Mapping):
                raise TypeError(f"flightlog: log() takes a dict of metrics, got {type(metrics).__name__}")
        data = dict(metrics)
        if _PLAIN.issuperset(map(type, data.values())):
            kind = PLAIN_METRICS  # (the writer then skips its own look at the types)
        else:
            snapshot_in_place(data)
            kind = METRICS
        if self._hooks:
            self._run_hooks(data, step)
            kind = METRICS
        items = self._items
        if len(items) >= self._maxsize and not self._make_room():
            return
        items.append((kind, _time(), step, epoch, data))

    def _log_built(self, build: Callable[[list[tuple[Any, ...]]], list[dict[str, Any]]], args: tuple[Any, ...], step: int, epoch: float | None) -> None:
        """A metrics record the writer thread puts together from ``args`` (StepTimer's: see
        :data:`flightlog.pipeline.queue.BUILT_METRICS`): kept or thinned as ``log`` would,
        the loop's own metrics (``args[0]``, a dict of flightlog's) snapshotted here, the
        rest already captured by the caller. Not for a run with ``on_log`` hooks: they see
        whole records on this thread."""
        self._next_step = step + 1
        metrics = args[0]
        if self._thinning and not self._keep(step, epoch, metrics):
            return
        snapshot_in_place(metrics)
        self._put((BUILT_METRICS, _time(), step, epoch, (build, args)))

    def _make_room(self) -> bool:
        """The queue is full, or the run is finished (maxsize -1): apply the policy."""
        if self._finished:
            self._after_finish(None)
            return False
        self.queue.make_room()
        return True

    def _put(self, item: Any) -> None:
        if len(self._items) >= self._maxsize and not self._make_room():
            return
        self._items.append(item)

    @staticmethod
    def _coerce_step(step: Any) -> int:
        if isinstance(step, bool) or not hasattr(step, "__index__"):
            raise TypeError(f"flightlog: step must be an integer, got {step!r} ({type(step).__name__})")
        return int(step.__index__())

    def _keep(self, step: int, epoch: Any, metrics: Mapping[str, Any]) -> bool:
        if step % self._stride:
            return has_eval_metrics(metrics)
        if self._epoch_cap is not None and epoch is not None:
            whole = int(epoch)
            if whole != self._epoch_seen:
                self._epoch_seen, self._epoch_count = whole, 0
            if self._epoch_count >= self._epoch_cap:
                return has_eval_metrics(metrics)
            self._epoch_count += 1
        return True

    def _run_hooks(self, data: dict[str, Any], step: int) -> None:
        for hook in self._hooks:
            try:
                extra = hook(data, step)
                if isinstance(extra, Mapping):
                    data.update(snapshot(extra))
            except Exception as exc:
                name = getattr(hook, "__name__", repr(hook))
                self.event(f"on_log hook {name} failed: {type(exc).__name__}: {exc}", level="ERROR", source="flightlog/hooks")

    # ------------------------------------------------------------------ other records
    def record(self, type: str, step: int | None = None, epoch: float | None = None, **fields: Any) -> None:
        """Enqueue a record of any protocol type (used by integrations, rules, checkpoints)."""
        if step is not None and step.__class__ is not int:  # (``type`` names the record type here)
            step = self._coerce_step(step)
        self._put((type, _time(), step, epoch, snapshot_in_place(fields)))  # (keywords: a private dict)

    def event(self, message: str, level: str = "INFO", *, stacklevel: int = 1, **fields: Any) -> None:
        """A system log line with the caller's ``file:line`` (always written, never thinned)."""
        number = LEVEL_NUMBERS.get(level) or LEVEL_NUMBERS.get(str(level).upper())
        if number is None:
            raise ValueError(f"flightlog: event level {level!r} is not one of {', '.join(LEVELS)}")
        if number < self._level:
            return
        fields.setdefault("source", _caller(stacklevel))
        step = fields.pop("step", None)
        if step is not None and type(step) is not int:
            step = self._coerce_step(step)  # (a step that is no integer: refused by name, like Run.log's)
        self._put((EVENT, _time(), step, fields.pop("epoch", None), {"level": str(level).upper(), "message": str(message), **fields}))

    def alert(
        self,
        rule: str,
        message: str,
        *,
        severity: str = "warning",
        value: Any = None,
        threshold: Any = None,
        action: str | None = None,
        step: int | None = None,
        **fields: Any,
    ) -> None:
        """An alert record (the diagnosis rules use this; user code may too)."""
        data = {"rule": rule, "severity": severity, "message": message, **fields}
        if value is not None:
            data["value"] = value
        if threshold is not None:
            data["threshold"] = threshold
        if action:
            data["action"] = action
        self.record(ALERT, step=step, **data)

    def checkpoint(self, status: str, path: str | os.PathLike[str], *, step: int | None = None, **fields: Any) -> None:
        """A checkpoint record: ``status`` is saved, loaded or rejected."""
        if status not in CHECKPOINT_STATUSES:
            raise ValueError(f"flightlog: checkpoint status {status!r} is not one of {', '.join(CHECKPOINT_STATUSES)}")
        self.record(CHECKPOINT, step=step, status=status, path=os.fspath(path), **fields)

    def on_log(self, hook: OnLogHook) -> OnLogHook:
        """Register ``hook(metrics, step)`` run on the training thread at each kept ``log``.

        It may add keys to ``metrics`` in place or return a dict of extra metrics
        (the seeds' ``on_log`` example: GPU memory, the current learning rate).
        """
        self._hooks.append(hook)
        return hook

    def add_processor(self, processor: Processor) -> None:
        """Add a writer-thread processor; it runs after the ones given to ``init``, before redaction."""
        self.writer.processors = [*self.writer.processors, processor]

    def add_observer(self, observer: Processor) -> None:
        """Add a writer-thread stage that sees records after redaction (diagnosis rules, exporters)."""
        self.writer.observers = [*self.writer.observers, observer]

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until everything logged so far is written and flushed to the sinks."""
        return self.writer.flush(timeout)

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def dropped(self) -> int:
        """Records dropped by the ``drop_oldest`` policy."""
        return self.queue.dropped

    def finish(self, status: str = "finished", summary: Mapping[str, Any] | None = None, timeout: float = 30.0) -> None:
        """End the run: drain and close the sinks, write ``run_end`` and the final ``run.json``."""
        if status not in RUN_STATUSES or status == "running":
            raise ValueError(f"flightlog: finish status {status!r} is not one of finished, failed, interrupted")
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        self.writer.flush(timeout)
        final = self.summary.summary()
        if summary:
            final.update(summary)
        self.queue.put_urgent((RUN_END, _time(), final.get("last_step"), None, {"status": status, "summary": final}))
        self._maxsize = -1  # every later record takes the slow path, which refuses it
        closed = self.writer.close(timeout)
        if self.rules is not None:
            self.rules.close()
        end = format_timestamp(_time())
        self.run_file.update(
            fsync=True,
            status=status,
            end_time=end,
            last_step=final.get("last_step"),
            summary=self._redactor.redact_nested(final) if self._redactor else final,
            **self._counters(),
            **({} if closed else {"writer_timeout": True}),
        )
        self._update_index(None)
        self._restore_signal_handlers()
        try:
            atexit.unregister(self._at_exit)
        except Exception:
            pass
        global _current
        if _current is self:
            _current = None

    def _counters(self) -> dict[str, Any]:
        return {
            "records_written": self.writer.records_written,
            "records_dropped": self.queue.dropped,
            "sink_failures": dict(self.writer.sink_failures),
            "rejected_values": self.writer.rejected_values,
        }

    def _after_finish(self, item: Any) -> None:
        if not self._warned_after_finish:
            self._warned_after_finish = True
            warnings.warn(f"flightlog: run {self.run_id} is finished; further records are ignored", RuntimeWarning, stacklevel=3)

    def _heartbeat(self, writer: Writer) -> None:
        self.run_file.update(status="running", last_step=self.summary.last_step, **self._counters())
        summary = self.summary.summary()
        self._update_index(self._redactor.redact_nested(summary) if self._redactor else summary)

    def _update_index(self, summary: dict[str, Any] | None) -> None:
        """Keep this run current in the run index (``flightlog ls``); an index failure never reaches training."""
        if not self.config.index:
            return
        try:
            from flightlog.store.index import upsert_run

            upsert_run(self.run_file.meta, summary)
        except Exception:
            pass

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish("finished")
        else:
            if not issubclass(exc_type, KeyboardInterrupt):
                self.event(f"run ended by {exc_type.__name__}: {exc}", level="ERROR", source="flightlog")
            self.finish("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")

    def _at_exit(self) -> None:
        if not self._finished:
            self.finish(_exit_status or "finished", timeout=10.0)

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._signal_handlers[signum] = signal.signal(signum, self._on_signal)
            except (ValueError, OSError):
                pass

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._signal_handlers.items():
            try:
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous)
            except (ValueError, OSError, TypeError):
                pass
        self._signal_handlers.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        previous = self._signal_handlers.get(signum, signal.SIG_DFL)
        if signum == signal.SIGINT and callable(previous):
            # Usually raises KeyboardInterrupt; the run ends as interrupted on the way out.
            self.event(f"received {name}", level="WARNING", source="flightlog")
            self.flush(timeout=5.0)
            previous(signum, frame)
            return
        self.event(f"received {name}; flushing and ending the run as interrupted", level="WARNING", source="flightlog")
        self.finish("interrupted", timeout=10.0)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


# ---------------------------------------------------------------------- module API
def _excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
    global _exit_status
    _exit_status = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"
    run = _current
    if run is not None and not run.finished and not issubclass(exc_type, KeyboardInterrupt):
        try:
            run.event(f"uncaught {exc_type.__name__}: {exc}", level="CRITICAL", source="flightlog")
        except Exception:
            pass
    _previous_excepthook(exc_type, exc, tb)


_previous_excepthook = sys.excepthook


def init(
    output_dir: str | os.PathLike[str] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    processors: Iterable[Processor] = (),
    on_log: Iterable[OnLogHook] = (),
    **options: Any,
) -> Run:
    """Start (or continue) a run and make it the current one.

    Keyword arguments are the fields of :class:`flightlog.config.Config`
    (``run_name``, ``task_type``, ``model_name``, ``dataset``, ``config``,
    ``logging_steps``, ``sinks`` ...). YAML (``config_file`` or ``FLIGHTLOG_CONFIG``) and
    ``FLIGHTLOG_*`` environment variables fill in what is not given here.
    """
    global _current
    if output_dir is not None:
        options["output_dir"] = output_dir
    config = build_config(config_file=config_file, **options)
    if sys.excepthook is not _excepthook:
        global _previous_excepthook
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
    run = None
    if "torch.distributed" in sys.modules:  # never import torch here: only a loaded one can have a group
        from flightlog.dist import start_run

        run = start_run(config, processors=processors, on_log=on_log)
    if run is None:
        run = Run(config, processors=processors, on_log=on_log)
    _current = run
    return run


def current_run() -> Run | None:
    return _current


def _require_run() -> Run:
    if _current is None:
        raise RuntimeError("flightlog: no active run; call flightlog.init(...) first")
    return _current


def log(metrics: Mapping[str, Any], step: int | None = None, epoch: float | None = None) -> None:
    """``log`` on the current run."""
    _require_run().log(metrics, step=step, epoch=epoch)


def event(message: str, level: str = "INFO", **fields: Any) -> None:
    """``event`` on the current run, with the caller's file:line."""
    _require_run().event(message, level, stacklevel=2, **fields)


def finish(status: str = "finished", summary: Mapping[str, Any] | None = None) -> None:
    """``finish`` the current run (a no-op when there is none)."""
    if _current is not None:
        _current.finish(status, summary)
