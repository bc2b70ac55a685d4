"""flightlog: the flight recorder and cockpit of model-training runs.

    import flightlog
    with flightlog.init(output_dir="output", run_name="llama3-lora", task_type="sft") as run:
        for step in range(1, 501):
            ...
            run.log({"loss": loss, "learning_rate": lr}, step=step)

This module only re-exports; it imports nothing heavy (no torch, no pandas).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from flightlog.config import Config, ConfigError
from flightlog.loghandler import LogHandler
from flightlog.pipeline.processors import DropRecord
from flightlog.run import Run, current_run, event, finish, init, log

if TYPE_CHECKING:
    import pandas


def load(path_or_run: Any, **kwargs: Any) -> "pandas.DataFrame":
    """Read a run's records into a pandas DataFrame (see :func:`flightlog.store.reader.load`)."""
    from flightlog.store.reader import load as _load

    return _load(path_or_run, **kwargs)


def runs(
    where: str | None = None,
    sort: Any = None,
    limit: int | None = None,
    as_frame: bool = False,
) -> "list[dict[str, Any]] | pandas.DataFrame":
    """Indexed runs matching ``where`` (the ``flightlog ls --where`` language), newest first.

    Each run is a dict of run fields with ``params``, ``best`` and ``final``; with
    ``as_frame=True`` a pandas DataFrame with one row a run and columns
    ``param.X``, ``best.X``, ``final.X`` (see :mod:`flightlog.store.index`).
    """
    from flightlog.store.api import runs as _runs

    return _runs(where=where, sort=sort, limit=limit, as_frame=as_frame)


__all__ = [
    "Config",
    "ConfigError",
    "DropRecord",
    "LogHandler",
    "Run",
    "__version__",
    "current_run",
    "event",
    "finish",
    "init",
    "load",
    "log",
    "runs",
]
