"""The rules inside a real run: alerts in the stream and on the console, the stall timer
while the training thread is stuck, and the stop-gracefully policy on real torch training."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

import flightlog
from flightlog.sinks.console import ConsoleSink


def records(run: Any, kind: str | None = None) -> list[dict[str, Any]]:
    lines = (run.log_dir / "train.jsonl").read_text().splitlines()
    out = [json.loads(line) for line in lines if line.strip()]
    return [r for r in out if kind is None or r["type"] == kind]


def test_alert_in_stream_and_console(tmp_path: Path) -> None:
    """A spike becomes one alert record (value, threshold, seeds' action) and a console line."""
    console = io.StringIO()
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl", ConsoleSink(console)], install_signal_handlers=False)
    for step in range(1, 201):
        loss = 2.0 - step * 0.002 + (0.01 if step % 2 else -0.01) + (1.6 if step == 150 else 0.0)
        run.log({"loss": loss, "learning_rate": 1e-4}, step=step)
    run.finish()
    (alert,) = records(run, "alert")
    assert alert["rule"] == "loss_spike" and alert["step"] == 150 and alert["severity"] == "warning"
    assert alert["value"] > alert["threshold"] and "max_grad_norm 1.0" in alert["action"]
    assert "[WARNING] [flightlog/rules] ALERT loss_spike: loss" in console.getvalue()
    assert "-> clip gradients with --max_grad_norm 1.0" in console.getvalue()


def test_warmup_swings_are_noted_not_alarmed(tmp_path: Path) -> None:
    """The seeds' case 1 (loss 3.0~5.0 while stage == warmup): an INFO event saying it is expected."""
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False)
    for step in range(1, 101):
        run.log({"loss": 4.0 + (0.9 if step % 2 else -0.9), "learning_rate": 2e-7 * step, "stage": "warmup"}, step=step)
    run.finish()
    assert records(run, "alert") == []
    notes = [r for r in records(run, "event") if r.get("source") == "flightlog/rules"]
    assert notes and notes[0]["level"] == "INFO" and "expected during warmup; no action needed" in notes[0]["message"]


def test_stall_timer_fires_while_training_thread_is_stuck(tmp_path: Path) -> None:
    """The training thread sleeps (stuck dataloader); the timer thread writes the stall alert meanwhile."""
    rules = {"stall": {"min_seconds": 0.3, "factor": 3.0, "check_interval": 0.05, "min_intervals": 3}}
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, flush_interval=0.05, rules=rules)
    for step in range(1, 11):
        run.log({"loss": 2.0}, step=step)
        time.sleep(0.02)
    deadline = time.monotonic() + 5.0
    stalls: list[dict[str, Any]] = []
    while not stalls and time.monotonic() < deadline:  # the loop is "stuck": it logs nothing
        time.sleep(0.05)
        stalls = [r for r in records(run) if r["type"] == "alert" and r["rule"] == "stall"]
    assert stalls, "no stall alert while the training thread was stuck"
    assert stalls[0]["severity"] == "critical" and stalls[0]["step"] == 10 and "dataset_num_proc" in stalls[0]["action"]
    run.log({"loss": 2.0}, step=11)
    run.finish()
    resumed = [r for r in records(run, "event") if "training resumed at step 11" in r.get("message", "")]
    assert resumed and resumed[0]["level"] == "INFO"
    assert len([r for r in records(run, "alert") if r["rule"] == "stall"]) == 1


@pytest.mark.slow
def test_stop_policy_on_real_torch_divergence(tmp_path: Path) -> None:
    """Real torch training with a learning rate far too high: the loss overflows to inf/NaN, the
    critical alert sets run.should_stop, and the loop saves a checkpoint and stops early."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    x, y = torch.randn(256, 16), torch.randn(256, 1)
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, flush_interval=0.02,
                         rules={"on_critical": "stop"}, max_steps=20000)
    stopped_at = None
    for step in range(1, 20001):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grad = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        run.log({"loss": loss.detach(), "grad_norm": grad, "learning_rate": 5.0}, step=step)
        if run.should_stop:
            torch.save(model.state_dict(), tmp_path / "checkpoint.pt")
            run.checkpoint("saved", tmp_path / "checkpoint.pt", step=step)
            stopped_at = step
            break
        time.sleep(0.001)
    run.finish()
    assert stopped_at is not None and stopped_at < 20000
    assert run.stop_reason is not None and run.stop_reason.startswith("nonfinite")
    kinds = [(r["type"], r.get("rule") or r.get("status")) for r in records(run) if r["type"] in ("alert", "checkpoint")]
    assert ("alert", "nonfinite") in kinds and kinds[-1] == ("checkpoint", "saved")
    asked = [r for r in records(run, "event") if "run.should_stop is set" in r.get("message", "")]
    assert asked and asked[0]["level"] == "WARNING"
