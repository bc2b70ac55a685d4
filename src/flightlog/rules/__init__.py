"""Diagnosis rules: detectors that watch every metrics record, alerts, notifiers, actions.

``attach(run)`` wires them into a run (called by ``Run`` when ``rules`` is enabled):
the engine becomes a writer-thread processor, a timer thread watches for stalls,
notifiers deliver alerts from their own threads, and the optional stop policy sets
``run.should_stop``. Nothing here runs on the training thread.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

from flightlog.protocol import ALERT, EVENT
from flightlog.rules.config import RulesConfig, load
from flightlog.rules.detectors import DETECTORS, Finding
from flightlog.rules.engine import RulesEngine, finding_to_record

__all__ = ["DETECTORS", "Finding", "RulesConfig", "RulesEngine", "Rules", "attach", "load"]


class Rules:
    """What ``attach`` started for a run; ``close`` stops it at ``finish``."""

    def __init__(self, engine: RulesEngine, timer: Any, dispatcher: Any) -> None:
        self.engine = engine
        self.timer = timer
        self.dispatcher = dispatcher

    def close(self, timeout: float = 2.0) -> None:
        if self.timer is not None:
            self.timer.stop()
        if self.dispatcher is not None:
            self.dispatcher.close(timeout)


def attach(run: Any) -> Rules | None:
    """Build the rules for ``run`` from its ``rules`` and ``notify`` settings (None when off)."""
    config = load(getattr(run.config, "rules", True))
    specs_raw = list(getattr(run.config, "notify", []) or [])
    if not config.enabled:
        return None
    from flightlog.rules.notify import parse_spec

    specs = [parse_spec(raw, i) for i, raw in enumerate(specs_raw)]

    def enqueue(record: dict[str, Any]) -> None:
        """From any thread, never blocking (stall timer, notifier errors, stop notices)."""
        fields = dict(record)
        kind = fields.pop("type")
        run.queue.put_urgent((kind, time.time(), fields.pop("step", None), fields.pop("epoch", None), fields))

    def note(message: str, level: str = "WARNING") -> None:
        if not run.finished:
            enqueue({"type": EVENT, "level": level, "source": "flightlog/rules", "message": message})

    handlers: list[Callable[[dict[str, Any]], None]] = []
    dispatcher = None
    if specs:
        from flightlog.rules.notify import Dispatcher

        info = {"run_id": run.run_id, "run_name": run.run_name, "host": socket.gethostname(), "log_dir": str(run.log_dir)}
        dispatcher = Dispatcher(specs, info, on_error=note)
        handlers.append(dispatcher)
    if config.on_critical == "stop":
        from flightlog.rules.actions import StopPolicy

        handlers.append(StopPolicy(run, announce=note))

    def on_alert(alert: dict[str, Any]) -> None:
        for handler in handlers:
            try:
                handler(alert)
            except Exception as exc:  # an action must never break the writer
                note(f"alert handler {type(handler).__name__} failed: {type(exc).__name__}: {exc}")

    timer = watch = None
    if config.stall.enabled:
        from flightlog.rules.stall import StallTimer, StallWatch

        watch = StallWatch(config.stall)

        def report(finding: Finding) -> None:
            record = finding_to_record(finding)
            enqueue(record)
            if record["type"] == ALERT:
                on_alert(record)

        timer = StallTimer(watch, report)
    engine = RulesEngine(config, emit=run.writer.emit, on_alert=on_alert if handlers else None, watch=watch)
    run.add_observer(engine)  # after redaction; its own alerts are not fed back to it
    if timer is not None:
        timer.start()
    return Rules(engine, timer, dispatcher)
