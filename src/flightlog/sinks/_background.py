"""A sink that talks to a remote or slow store on its own thread (wandb, mlflow).

The writer thread serves every sink in turn, so one slow store (an MLflow server that
hangs, a W&B init that takes seconds) would hold back ``train.jsonl`` and, once the
queue fills, the training loop. This wrapper gives such a backend its own thread and
a bounded backlog: ``write`` only appends, the oldest batches are dropped (and
counted) when the store cannot keep up, and a backend failure is re-raised on the
next ``write`` so the writer reports it like any sink failure, while the other sinks
keep going.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Protocol

from flightlog.sinks.base import BaseSink, Record


class Backend(Protocol):
    def send(self, batch: list[Record]) -> None: ...
    def close(self) -> None: ...


class BackgroundSink(BaseSink):
    """Runs ``backend.send`` on a daemon thread; ``close`` waits up to ``close_timeout`` s for the backlog."""

    def __init__(self, backend: Backend, *, name: str, max_records: int = 100_000, close_timeout: float = 20.0) -> None:
        self.name = name
        self.backend = backend
        self.max_records = max_records
        self.close_timeout = close_timeout
        self.dropped = 0
        self.sent = 0
        self._pending: collections.deque[list[Record]] = collections.deque()
        self._pending_records = 0
        self._busy = False
        self._error: BaseException | None = None
        self._reported: BaseException | None = None
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"flightlog-{name}", daemon=True)
        self._thread.start()

    def write(self, batch: list[Record]) -> None:
        with self._cond:
            error = self._error
            self._pending.append(batch)
            self._pending_records += len(batch)
            while self._pending_records > self.max_records and len(self._pending) > 1:
                old = self._pending.popleft()
                self._pending_records -= len(old)
                self.dropped += len(old)
            self._cond.notify()
        if error is not None and error is not self._reported:
            self._reported = error
            raise error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    break
                batch = self._pending.popleft()
                self._pending_records -= len(batch)
                self._busy = True
            try:
                self.backend.send(batch)
                self.sent += len(batch)
            except Exception as exc:  # kept for the writer to report; the next batch tries again
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        try:
            self.backend.close()
        except Exception as exc:
            with self._cond:
                self._error = exc

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything written so far reached the backend (for tests and ``finish``)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            raise TimeoutError(
                f"{self.name} store did not take the last {self._pending_records} record(s) within {self.close_timeout:g}s; "
                "they are in train.jsonl but not in the store"
            )
        if self._error is not None and self._error is not self._reported:
            self._reported = self._error
            raise self._error

    @property
    def error(self) -> Any:
        return self._error
