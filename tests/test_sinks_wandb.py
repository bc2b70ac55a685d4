"""The wandb sink in offline mode, read back from the run's ``.wandb`` file with W&B's own protobufs."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

import flightlog
from flightlog.protocol import decode

if importlib.util.find_spec("wandb") is None:
    pytest.skip("the wandb extra is not installed (pip install 'flightlog[wandb]')", allow_module_level=True)

QUIET = dict(console_stream="stderr", install_signal_handlers=False)


def read_wandb_records(path: Path) -> list[Any]:
    """Records of a ``.wandb`` transaction log: W&B's LevelDB-style log of ``wandb_internal_pb2.Record``.

    The file is a 7-byte header (``:W&B``, magic, version) then 32 KiB blocks of chunks,
    each ``crc32(4) length(2) type(1)`` + payload; type 1 is a whole record, 2/3/4 the
    first/middle/last piece of one. wandb >= 0.19 ships no Python reader, so this is one.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, pieces, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if length == 0 and kind == 0:  # block padding
            pos += left - 7
            continue
        pieces += data[pos : pos + length]
        pos += length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            out.append(record)
            pieces = b""
    return out


def history_rows(records: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json) if item.value_json not in ("NaN", "Infinity", "-Infinity") else float(item.value_json)
            rows.append(row)
    return rows


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return tmp_path


@pytest.mark.slow
def test_offline_run_holds_every_logged_metric(offline_wandb: Path) -> None:
    """Every numeric field of every metrics record is in the W&B history, at its step; config and exit are there."""
    out = offline_wandb / "out"
    run = flightlog.init(out, sinks=["jsonl", "wandb"], run_name="wb-run", task_type="sft", config={"learning_rate": 3e-4, "lora": {"r": 8}}, **QUIET)
    for step in range(1, 21):
        run.log({"loss": 2.0 / step, "learning_rate": 3e-4, "stage": "warmup" if step < 5 else "stable", "tokens": 128 * step}, step=step, epoch=step / 10)
        if step == 7:
            run.log({"loss": float("nan")}, step=step)
        if step % 10 == 0:
            run.log({"eval_loss": 1.0 / step, "eval_accuracy": step / 40}, step=step)
    run.record("histograms", step=20, histograms={"lora/q.lora_A": {"min": -1.0, "max": 1.0, "num": 4, "sum": 0.0, "sum_squares": 2.0, "bucket_limit": [0.0, 1.0], "bucket": [2.0, 2.0]}})
    run.finish()
    meta = flightlog.runfile.read_run_file(out / "logs")
    assert meta["sink_failures"] == {}

    (path,) = (out / "logs" / "wandb").glob(f"offline-run-*-{run.run_id}/run-{run.run_id}.wandb")
    records = read_wandb_records(path)
    kinds = [r.WhichOneof("record_type") for r in records]
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert header.run_id == run.run_id and header.display_name == "wb-run" and header.project == "flightlog"
    assert list(header.tags) == ["sft"]
    config = {item.key: json.loads(item.value_json) for item in header.config.update}
    assert config["learning_rate"] == 3e-4 and config["lora"] == {"r": 8}
    assert config["flightlog_task_type"] == "sft"

    rows = history_rows(records)
    metric_rows = [row for row in rows if not any(k.startswith("lora/") for k in row)]
    logged = [decode(line) for line in (out / "logs" / "train.jsonl").read_bytes().splitlines()]
    logged = [r for r in logged if r["type"] == "metrics"]
    assert len(metric_rows) == len(logged) == 20 + 1 + 2
    for record, row in zip(logged, metric_rows):
        assert row["train/global_step"] == record["step"]
        expected = {("eval/" + k[5:] if k.startswith("eval_") else "train/" + k): v for k, v in record.items()
                    if k not in ("type", "timestamp", "run_id", "step") and not isinstance(v, str)}
        got = {k: v for k, v in row.items() if not k.startswith("_") and k != "train/global_step"}
        assert got.keys() == expected.keys(), (record, row)
        for key, value in expected.items():
            assert (math.isnan(got[key]) and math.isnan(value)) or got[key] == value, (key, record["step"])
    assert "train/stage" not in {k for row in rows for k in row}
    (hist_row,) = [row for row in rows if "lora/q.lora_A/_type" in row]  # nested keys, joined with "/"
    assert hist_row["train/global_step"] == 20 and hist_row["lora/q.lora_A/_type"] == "histogram"
    assert hist_row["lora/q.lora_A/values"] == [2, 2] and hist_row["lora/q.lora_A/bins"] == [-1.0, 0.0, 1.0]
    assert kinds[-1] == "exit" and records[-1].exit.exit_code == 0


@pytest.mark.slow
def test_failed_run_exits_nonzero(offline_wandb: Path) -> None:
    run = flightlog.init(offline_wandb / "out", sinks=["wandb"], **QUIET)
    run.log({"loss": 1.0}, step=1)
    run.finish("failed")
    (path,) = (offline_wandb / "out" / "logs" / "wandb").glob("offline-run-*/*.wandb")
    records = read_wandb_records(path)
    assert records[-1].WhichOneof("record_type") == "exit" and records[-1].exit.exit_code == 1
    assert history_rows(records)[0]["train/loss"] == 1.0
