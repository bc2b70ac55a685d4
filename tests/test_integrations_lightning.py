"""FlightlogLogger + FlightlogCallback on a real Lightning Trainer (CPU), side by side with CSVLogger."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")
from torch import nn

import flightlog
from flightlog.integrations.lightning import FlightlogCallback, FlightlogLogger


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=10)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loaders() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    ds = torch.utils.data.TensorDataset(x, y)
    return (
        torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=g),
        torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(32)), batch_size=16),
    )


@pytest.mark.slow
def test_lightning_records_match_csv_logger(tmp_path: Path) -> None:
    """Every row Lightning's CSVLogger writes is a flightlog record with the same step and values;
    training records also carry the collectors' fields; hparams are in run_start; checkpoints recorded."""
    torch.manual_seed(0)
    logger = FlightlogLogger(tmp_path / "out", run_name="reg", task_type="regression", sinks=["jsonl"], install_signal_handlers=False)
    csv_logger = L.loggers.CSVLogger(tmp_path / "csv", name="", version="")
    trainer = L.Trainer(
        max_steps=40, log_every_n_steps=5, val_check_interval=20, logger=[logger, csv_logger],
        callbacks=[FlightlogCallback()], accelerator="cpu", enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )
    train, val = loaders()
    trainer.fit(Regressor(), train, val)

    records = [json.loads(line) for line in (tmp_path / "out" / "logs" / "train.jsonl").read_text().splitlines()]
    metrics = [r for r in records if r["type"] == "metrics"]
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    assert len(rows) == len(metrics) >= 9
    for row, record in zip(rows, metrics):
        assert record["step"] == int(row["step"])
        for key, text in row.items():
            if key != "step" and text != "":
                assert record[key] == pytest.approx(float(text), rel=1e-6), key

    train_records = [r for r in metrics if "train_loss" in r]
    assert [r["step"] for r in train_records] == [4, 9, 14, 19, 24, 29, 34, 39]
    for r in train_records:
        assert r["step_time_s"] > 0 and r["throughput_samples_per_sec"] == pytest.approx(8 / r["step_time_s"])
        assert r["grad_norm"] > 0 and "grad_norm_adapter" not in r
        assert r["precision"] == "fp32" and r["learning_rate"] > 0
    assert [r["stage"] for r in train_records][:3] == ["warmup", "warmup", "stable"]
    assert [r["step"] for r in metrics if "val_loss" in r] == [19]  # Lightning numbers it like the train row before it

    start = records[0]
    assert start["type"] == "run_start" and start["config"] == {"lr": 0.05, "hidden": 16}
    assert start["run_name"] == "reg" and start["task_type"] == "regression"
    saved = [r for r in records if r["type"] == "checkpoint"]
    assert saved and all(r["bytes"] > 0 and Path(r["path"]).parent == tmp_path / "out" / "checkpoints" for r in saved)
    assert records[-1]["type"] == "run_end" and records[-1]["status"] == "finished"


def test_callback_without_logger_or_run_fails_clearly(tmp_path: Path) -> None:
    assert flightlog.current_run() is None
    trainer = L.Trainer(max_steps=1, logger=False, callbacks=[FlightlogCallback()], accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False, default_root_dir=tmp_path)
    train, _ = loaders()
    with pytest.raises(RuntimeError, match="FlightlogLogger"):
        trainer.fit(Regressor(), train)
    with pytest.raises(ValueError, match="batch_size"):
        FlightlogCallback(batch_size=0)
