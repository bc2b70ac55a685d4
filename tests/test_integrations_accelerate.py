"""FlightlogTracker with a real Accelerator on the CPU, with StepTimer collectors in the same loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")
from torch import nn

import flightlog
from flightlog.collect import Collectors, StepTimer
from flightlog.integrations.accelerate import FlightlogTracker


@pytest.mark.slow
def test_accelerate_log_and_config(tmp_path: Path) -> None:
    """init_trackers' config lands in run_start; each accelerator.log is one record with its values,
    merged with the StepTimer's fields on logging steps; end_training finishes the run."""
    torch.manual_seed(0)
    tracker = FlightlogTracker(tmp_path / "out", run_name="acc", sinks=["jsonl"], install_signal_handlers=False)
    accelerator = accelerate.Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("proj", config={"lr": 0.01, "batch_size": 8, "dtype": torch.float32})
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(160, 4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    run = accelerator.get_tracker("flightlog", unwrap=True)
    assert run is tracker.run
    timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt), logging_steps=5, batch_size=8)
    logged = {}
    for batch in timer.data(loader):
        with timer.step() as step:
            xb, yb = batch
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            step.log(loss=loss.detach())
        if timer.step_count % 10 == 0:
            logged[timer.step_count] = {"loss_item": loss.item(), "epoch": timer.step_count / 20}
            accelerator.log(logged[timer.step_count], step=timer.step_count)
    accelerator.end_training()

    records = [json.loads(line) for line in (tmp_path / "out" / "logs" / "train.jsonl").read_text().splitlines()]
    start = records[0]
    assert start["type"] == "run_start" and start["run_name"] == "acc"
    assert start["config"] == {"lr": 0.01, "batch_size": 8, "dtype": "torch.float32"}
    tracked = [r for r in records if r["type"] == "metrics" and "loss_item" in r]
    assert [(r["step"], r["loss_item"], r["epoch"]) for r in tracked] == [(s, v["loss_item"], v["epoch"]) for s, v in logged.items()]
    timed = [r for r in records if r["type"] == "metrics" and "step_time_s" in r]
    assert [r["step"] for r in timed] == [5, 10, 15, 20]
    assert all(r["grad_norm"] > 0 and r["learning_rate"] == 0.01 for r in timed)
    assert records[-1]["type"] == "run_end" and records[-1]["status"] == "finished"


def test_tracker_without_config_and_bad_run(tmp_path: Path) -> None:
    """Without init_trackers' config the run starts at the first log; a non-Run is refused."""
    tracker = FlightlogTracker(tmp_path, sinks=["jsonl"], install_signal_handlers=False)
    tracker.log({"a": 1.0, "epoch": 0.5}, step=3)
    tracker.finish()
    lines = [json.loads(line) for line in (tmp_path / "logs" / "train.jsonl").read_text().splitlines()]
    assert [(r["type"], r.get("step"), r.get("a"), r.get("epoch")) for r in lines] == [
        ("run_start", None, None, None), ("metrics", 3, 1.0, 0.5), ("run_end", 3, None, None)
    ]
    with pytest.raises(TypeError, match="flightlog.Run"):
        FlightlogTracker(run="x")  # type: ignore[arg-type]
