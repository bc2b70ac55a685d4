"""The demo is a real training recorded end to end through the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

import flightlog
from flightlog.runfile import read_run_file


@pytest.mark.slow
def test_demo_cli_trains_and_records(tmp_path):
    """`python -m flightlog demo` trains, prints the seeds' console view and leaves a loadable run."""
    out = subprocess.run(
        [sys.executable, "-m", "flightlog", "demo", "--output-dir", str(tmp_path), "--steps", "120", "--logging-steps", "10"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Step 10/120 | epoch" in out.stdout and "| loss " in out.stdout and "| lr " in out.stdout
    assert "[INFO] [train.py:" in out.stdout and "Starting training..." in out.stdout
    frame = flightlog.load(tmp_path)
    train = frame[frame["loss"].notna()]
    assert train["step"].tolist() == list(range(10, 121, 10))
    assert train["loss"].iloc[-1] < train["loss"].iloc[0]  # it really learns
    assert frame["eval_accuracy"].dropna().iloc[-1] > 0.2
    meta = read_run_file(tmp_path / "logs")
    assert meta["status"] == "finished" and meta["task_type"] == "pretrain" and meta["config"]["steps"] == 120
