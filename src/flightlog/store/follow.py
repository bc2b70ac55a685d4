"""Following a growing stream file: complete lines only, from an offset, polling.

``flightlog tail -f`` reads what is there, then waits for more. A line the writer has
not finished yet (no newline) is held back until it is complete, so a reader never
sees half a record.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator


def read_complete(path: Path, offset: int = 0) -> tuple[list[bytes], int]:
    """Complete lines from ``offset`` and the offset just after the last of them."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[:end].split(b"\n"), offset + end + 1


def follow(
    path: Path,
    offset: int = 0,
    poll: float = 0.2,
    stop: Callable[[], bool] | None = None,
) -> Iterator[bytes]:
    """Lines appended to ``path`` from ``offset`` on, until ``stop()`` says so.

    ``stop`` is asked after each poll that found nothing new. A file that shrinks
    (rewritten from scratch) is read again from its start.
    """
    while True:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < offset:
            offset = 0
        lines, offset = read_complete(path, offset) if size > offset else ([], offset)
        yield from lines
        if not lines:
            if stop is not None and stop():
                return
            time.sleep(poll)


def last_lines(path: Path, wanted: int, keep: Callable[[bytes], bool], chunk: int = 1 << 18) -> tuple[list[bytes], int, list[bytes]]:
    """The last ``wanted`` complete lines that ``keep`` accepts, reading backwards from the end.

    Returns those lines, the offset just after the last complete line (to follow from),
    and every complete line read (the caller looks for the run's latest run_start/run_end
    there: the one that matters is always near the end). A stream of a million lines
    costs only the chunks it takes to find ``wanted`` matches.
    """
    size = path.stat().st_size
    while True:
        start = max(0, size - chunk)
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
        end = data.rfind(b"\n") + 1
        body = data[:end]
        if start > 0:
            body = body[body.find(b"\n") + 1 :]  # the first line was cut by the chunk border
        lines = [line for line in body.split(b"\n") if line.strip()]
        kept = [line for line in lines if keep(line)]
        if len(kept) >= wanted or start == 0:
            return (kept[len(kept) - wanted :] if wanted else []), start + end, lines
        chunk *= 4
