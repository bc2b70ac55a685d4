"""The console view of ``flightlog watch -- COMMAND``: the command's own output passes
through untouched, so flightlog adds only what the command cannot say itself (alerts,
the start and end of the recording), on stderr."""

from __future__ import annotations

import sys

from flightlog.sinks.console import ConsoleSink

_SHOWN = frozenset({"alert", "run_start", "run_end"})


class AlertConsole(ConsoleSink):
    name = "console"

    def write(self, batch: list[dict]) -> None:
        super().write([
            r for r in batch
            if r.get("type") in _SHOWN or (r.get("type") == "event" and str(r.get("source", "")).startswith("flightlog"))
        ])


def alert_console() -> AlertConsole:
    return AlertConsole(sys.stderr)
