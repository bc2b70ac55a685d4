"""``flightlog watch``: record runs that know nothing of flightlog, live.

:func:`watch_dir` follows a trainer's output folder; :func:`watch_command` runs a
training command and parses what it prints. Both feed a flightlog Run, so the records
pass the same processors (the diagnosis rules among them) and sinks as any run's.
"""

from flightlog.watch.command import watch_command
from flightlog.watch.directory import WatchResult, watch_dir

__all__ = ["WatchResult", "watch_command", "watch_dir"]
