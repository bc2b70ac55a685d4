"""The one small interface every sink implements.

The writer thread hands each sink batches of finished records (plain dicts whose
values are JSON-ready: numbers, strings, bools, None, lists and dicts). A sink may
raise; the writer counts the failure, records it as an event and keeps going.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

Record = dict[str, Any]


@runtime_checkable
class Sink(Protocol):
    """Where records go: a file, the console, a metrics server."""

    #: Short name used in config (``sinks=["jsonl", "console"]``) and in error events.
    name: str

    def write(self, batch: list[Record]) -> None:
        """Take a batch of records, in order. Must not keep references it mutates."""

    def flush(self) -> None:
        """Make what was written durable to the degree the sink can (called at least every flush interval)."""

    def close(self) -> None:
        """Flush and release resources; called once, from the writer thread."""


class BaseSink:
    """Convenience base: no-op flush and close."""

    name = "sink"

    def write(self, batch: list[Record]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.flush()
