"""``flightlog watch OUTPUT_DIR``: follow a trainer's output folder that knows nothing
of flightlog, and record it as a flightlog run while it trains.

The folder's format is detected (ms-swift ``logging.jsonl``, TensorBoard events, text
logs, HF ``trainer_state.json``); the best live source is followed. Watching ends when
the source says training ended (ms-swift's summary line, HF's ``train_runtime``), when
``pid`` exits, after ``idle_timeout`` seconds without new records, or on Ctrl-C.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from flightlog.runfile import pid_alive
from flightlog.store.importers import Detected, detect_formats
from flightlog.watch.feed import ProcessorFactory, RunFeeder


@dataclass
class WatchResult:
    status: str
    log_dir: Path
    run_id: str | None
    source: Detected | None
    metrics: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


def choose(output_dir: Path, fmt: str | None, exclude: Iterable[Path]) -> Detected | None:
    found = detect_formats(output_dir, exclude=exclude)
    if fmt:
        found = [d for d in found if d.format == fmt]
    live = [d for d in found if d.live]
    return (live or found or [None])[0]


def watch_dir(
    output_dir: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    idle_timeout: float | None = None,
    pid: int | None = None,
    poll_interval: float = 0.5,
    patterns: Iterable[str] = (),
    processors: Iterable[ProcessorFactory] = (),
    options: dict[str, Any] | None = None,
    sinks: list[Any] | None = None,
    run_name: str | None = None,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = print,
) -> WatchResult:
    """Follow ``output_dir`` live into a flightlog run in ``log_dir`` (default OUTPUT_DIR/logs;
    for ms-swift the ``logs`` folder inside the followed ``v{N}-{timestamp}`` folder)."""
    root = Path(output_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"flightlog watch: {str(root)!r} is not a directory")
    target = Path(log_dir) if log_dir else root / "logs"
    stop = stop or threading.Event()
    started = time.monotonic()

    def gone() -> bool:
        return stop.is_set() or (pid is not None and not pid_alive(pid))

    # Wait for something to follow: a watch may start before the trainer writes anything.
    source = choose(root, fmt, [target])
    announced = False
    while source is None:
        if not announced:
            say(f"flightlog watch: waiting for a training log in {root} ({'format ' + fmt if fmt else 'any format'})")
            announced = True
        if gone() or (idle_timeout is not None and time.monotonic() - started >= idle_timeout):
            return WatchResult("interrupted", target, None, None)
        stop.wait(poll_interval)
        source = choose(root, fmt, [target])
    say(f"flightlog watch: following {source.format} {source.path}")

    if not log_dir and source.format == "ms-swift":
        target = source.path.parent / "logs"  # each v{N}-{timestamp} folder is a run of its own
    importer = source.open(patterns=patterns) if source.format == "text" else source.open()
    feeder = RunFeeder(output_dir=root, log_dir=target, sinks=sinks if sinks is not None else ["jsonl", "console"], processors=processors, run_name=run_name, options=options)
    status, why = "interrupted", {}
    try:
        for record in importer.follow(poll_interval=poll_interval, stop=gone, idle_timeout=idle_timeout):
            feeder.feed(record)
            feeder.set_max_steps(_max_steps(importer))
        if importer.ended:
            status = str((feeder.end or {}).get("status") or "finished")
        elif pid is not None and not pid_alive(pid):
            status, why = "failed", {"reason": f"process {pid} exited without an end-of-training record"}
        elif stop.is_set():
            why = {"reason": "stopped"}
        else:
            why = {"reason": f"no new records for {idle_timeout} s"}
    except KeyboardInterrupt:
        why = {"reason": "interrupted by the user"}
    finally:
        summary = {"import": importer.stats.as_dict(), **why}
        feeder.finish(status, summary)
    run = feeder.run
    return WatchResult(status, target, run.run_id if run else None, source, feeder.metrics, importer.stats.as_dict())


def _max_steps(importer: Any) -> int | None:
    for holder in (importer, getattr(importer, "mapper", None), getattr(importer, "parser", None)):
        value = getattr(holder, "max_steps", None)
        if isinstance(value, int) and value > 0:
            return value
    return None
