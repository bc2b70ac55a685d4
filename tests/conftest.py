"""Shared fixtures: runs in temporary directories that never print to the test's console."""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test starts without FLIGHTLOG_* variables and with its own run index
    (FLIGHTLOG_HOME in tmp), never the user's ~/.flightlog."""
    for name in list(os.environ):
        if name.startswith("FLIGHTLOG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FLIGHTLOG_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def console() -> io.StringIO:
    return io.StringIO()


@pytest.fixture
def make_run(tmp_path, console, monkeypatch):
    """``make_run(**options)``: a flightlog run in tmp_path with the console captured."""
    import flightlog
    from flightlog.sinks.console import ConsoleSink

    runs = []

    def factory(**options):
        options.setdefault("output_dir", tmp_path / "out")
        options.setdefault("install_signal_handlers", False)
        if "sinks" not in options:
            options["sinks"] = ["jsonl", ConsoleSink(console)]
        run = flightlog.init(**options)
        runs.append(run)
        return run

    yield factory
    for run in runs:
        if not run.finished:
            run.finish()


def read_stream(path: Path) -> list[dict]:
    from flightlog.protocol import decode

    return [decode(line) for line in Path(path).read_bytes().splitlines() if line.strip()]


def have_jq() -> bool:
    return shutil.which("jq") is not None


def python() -> str:
    return sys.executable
