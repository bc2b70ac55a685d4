"""Processors: small callables that each finished record passes through, in order.

A processor takes a record dict and returns it (changed in place or a new dict), or
returns ``None`` / raises :class:`DropRecord` to drop it. They run on the writer
thread, so they may be slower than anything the training thread could afford; a
processor that raises is reported once and skipped, never fatal.

The writer's chain is: resolve values -> user processors -> redact -> rules -> sinks.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

Record = dict[str, Any]
Processor = Callable[[Record], Optional[Record]]


class DropRecord(BaseException):
    """Raised by a processor to drop the record.

    A ``BaseException`` so that a broad ``except Exception`` in user code cannot
    swallow it by accident; the writer catches it in exactly one place.
    """


def add_fields(**fields: Any) -> Processor:
    """A processor that adds constant fields to every metrics record (tags, a node name...)."""

    def processor(record: Record) -> Record:
        if record.get("type") == "metrics":
            for key, value in fields.items():
                record.setdefault(key, value)
        return record

    processor.__name__ = f"add_fields({', '.join(fields)})"
    return processor
