"""The bounded hand-off between the training thread and the writer thread.

``put`` is a ``deque.append`` (atomic under the GIL, ~50 ns) plus a length check.
The writer drains in chunks. When the queue is full the policy decides: ``block``
(default) makes the caller wait for the writer and warns once; ``drop_oldest``
discards the oldest record and counts it. Records are never dropped silently.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from itertools import repeat
from operator import call
from typing import Any


# An item's kind is its record's type, but for this one: a metrics record whose values
# Run.log found to be plain Python scalars (float, int, bool, str, None) when it copied
# them, so the writer need not look at their types again (it still checks for NaN).
PLAIN_METRICS = "metrics/plain"
# And a metrics record the writer thread puts together: its fields are ``(build, args)``;
# ``build(list_of_args)`` returns the metrics dicts of a chunk's records built by that
# function, and ``args[0]`` is the loop's own metrics, kept as they are should it fail.
BUILT_METRICS = "metrics/built"


class RecordQueue:
    def __init__(self, maxsize: int, on_full: str = "block") -> None:
        if on_full not in ("block", "drop_oldest"):
            raise ValueError(f"on_full must be 'block' or 'drop_oldest', got {on_full!r}")
        self.maxsize = maxsize
        self.on_full = on_full
        self._items: deque[Any] = deque()
        self.dropped = 0
        self.blocked_seconds = 0.0
        self._warned = False
        # Set by the queue when it wants the writer to drain now (full, or closing).
        self.wake = threading.Event()
        # Set by the writer after each drain, so a blocked producer can go on.
        self.space = threading.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any) -> None:
        """Enqueue (``Run.log`` inlines this: a length check and an append)."""
        if len(self._items) >= self.maxsize:
            self.make_room()
        self._items.append(item)

    def make_room(self) -> None:
        """Called by a producer that found the queue full: wait (block) or drop the oldest."""
        if self.on_full == "block":
            self._wait_for_space()
        else:
            try:
                self._items.popleft()
                self.dropped += 1
            except IndexError:
                pass
            self.wake.set()

    def _wait_for_space(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"flightlog: the record queue is full ({self.maxsize} records); log() waits for the writer. "
                "Raise queue_size, log less often (logging_steps), or set on_full='drop_oldest'.",
                RuntimeWarning,
                stacklevel=5,  # the caller of Run.log
            )
        start = time.perf_counter()
        while len(self._items) >= self.maxsize:
            self.space.clear()
            self.wake.set()
            self.space.wait(0.05)
        self.blocked_seconds += time.perf_counter() - start

    def put_urgent(self, item: Any) -> None:
        """Enqueue ignoring the bound (flightlog's own events, end-of-run records)."""
        self._items.append(item)
        self.wake.set()

    def drain(self, limit: int) -> list[Any]:
        """Up to ``limit`` items, oldest first (writer thread only).

        Under ``block`` only this thread removes items, so the count taken here stays
        available and a C-level ``map`` pops them. Under ``drop_oldest`` a producer may
        pop too, so items are taken one by one: an IndexError must not lose the ones taken.
        """
        items = self._items
        count = min(limit, len(items))
        if not count:
            return []
        if self.on_full == "block":
            out = list(map(call, repeat(items.popleft, count)))
        else:
            out = []
            pop = items.popleft
            try:
                for _ in range(count):
                    out.append(pop())
            except IndexError:
                pass
        if out:
            self.space.set()
        return out
