"""Python ``logging`` into the run's stream as ``event`` records.

Training code and libraries already log with the standard ``logging`` module
(transformers, ms-swift, your own ``logger.info``). Attaching this handler turns each
log record into an event with its level, ``file:line`` and message, so the stream
holds the same lines the console shows, structured.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flightlog.protocol import EVENT


class LogHandler(logging.Handler):
    """``logging.getLogger().addHandler(flightlog.LogHandler(run))``; ``run=None`` means the current run."""

    def __init__(self, run: Any = None, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        run = self.run
        if run is None:
            from flightlog.run import current_run

            run = current_run()
        if run is None or run.finished:
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + (self.formatter or logging.Formatter()).formatException(record.exc_info)
            level = record.levelname if record.levelname in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "INFO"
            run.record(
                EVENT,
                level=level,
                message=message,
                source=f"{os.path.basename(record.pathname)}:{record.lineno}",
                logger=record.name,
            )
        except Exception:
            self.handleError(record)
