"""``run.json``: the run's metadata and status, rewritten atomically.

Written at ``init``, refreshed with a heartbeat by the writer thread, and finalised at
``finish``. A run whose status is still ``running`` but whose heartbeat is older than
three heartbeat intervals is recognised as crashed.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from flightlog.protocol import RUN_FILE, SCHEMA_VERSION, dumps, format_timestamp, parse_timestamp

STALE_AFTER_INTERVALS = 3
MIN_STALE_SECONDS = 30.0


def write_atomic(path: Path, data: bytes, fsync: bool = True) -> None:
    """Write to a temporary name in the same directory, then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_run_file(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed ``run.json`` of a run directory, or None if there is none or it is unreadable."""
    path = Path(directory) / RUN_FILE
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return True


def effective_status(meta: dict[str, Any], now: float | None = None) -> str:
    """``crashed`` for a run that says ``running`` but stopped beating; else its status."""
    status = str(meta.get("status", "unknown"))
    if status != "running":
        return status
    beat = meta.get("heartbeat")
    interval = float(meta.get("heartbeat_interval", 10.0))
    if not beat:
        return status
    try:
        age = (now if now is not None else time.time()) - parse_timestamp(beat)
    except (ValueError, TypeError):
        return status
    return "crashed" if age > max(STALE_AFTER_INTERVALS * interval, MIN_STALE_SECONDS) else "running"


class RunFile:
    """Holds the metadata dict and rewrites ``run.json`` from any thread, under a lock."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.path = directory / RUN_FILE
        self.meta = {"schema_version": SCHEMA_VERSION, **meta}
        self._lock = threading.Lock()

    def update(self, fsync: bool = False, **fields: Any) -> None:
        with self._lock:
            self.meta.update(fields)
            self.meta["heartbeat"] = format_timestamp(time.time())
            write_atomic(self.path, dumps(self.meta), fsync=fsync)
