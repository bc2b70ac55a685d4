"""The console view of ``flightlog watch -- COMMAND``: the command's own output passes
through untouched, so flightlog adds only what the command cannot say itself (alerts,
the start and end of the recording), on stderr."""

from __future__ import annotations

import sys
from typing import TextIO

from flightlog.sinks.console import ConsoleSink

_SHOWN = frozenset({"alert", "run_start", "run_end"})


class StreamState:
    """Whether the command's last byte on our stderr ended a line (tqdm bars do not)."""

    def __init__(self) -> None:
        self.at_line_start = True

    def saw(self, data: bytes) -> None:
        if data:
            self.at_line_start = data.endswith(b"\n")


class AlertConsole(ConsoleSink):
    name = "console"

    def __init__(self, stream: TextIO, state: StreamState | None = None) -> None:
        super().__init__(stream)
        self.state = state or StreamState()

    def write(self, batch: list[dict]) -> None:
        shown = [
            r for r in batch
            if r.get("type") in _SHOWN or (r.get("type") == "event" and str(r.get("source", "")).startswith("flightlog"))
        ]
        if not shown:
            return
        if not self.state.at_line_start:
            self.stream.write("\n")  # do not glue an alert to the end of a progress bar
            self.state.at_line_start = True
        super().write(shown)


def alert_console(state: StreamState | None = None) -> AlertConsole:
    return AlertConsole(sys.stderr, state)
