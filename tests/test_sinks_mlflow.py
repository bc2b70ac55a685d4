"""The mlflow sink on a local SQLite store, read back with ``MlflowClient``; a dead server does not hurt."""

from __future__ import annotations

import importlib.util
import math
import socket
import time
from pathlib import Path

import pytest

import flightlog
from flightlog.protocol import decode

if importlib.util.find_spec("mlflow") is None:
    pytest.skip("the mlflow extra is not installed (pip install 'flightlog[mlflow]')", allow_module_level=True)

QUIET = dict(console_stream="stderr", install_signal_handlers=False)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy's, inside mlflow


def logged(log_dir: Path, kind: str = "metrics") -> list[dict]:
    records = [decode(line) for line in (log_dir / "train.jsonl").read_bytes().splitlines()]
    return [r for r in records if r["type"] == kind]


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return len(a) == len(b) and all(sa == sb and (va == vb or (math.isnan(va) and math.isnan(vb))) for (sa, va), (sb, vb) in zip(a, b))


@pytest.mark.slow
def test_local_store_holds_every_logged_metric_and_resume_continues_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Metric histories equal what flightlog logged; params, tags, status; a resumed run reuses the MLflow run."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "out"
    config = {"learning_rate": 2e-4, "lora": {"r": 8, "alpha": 16}, "targets": ["q_proj", "v_proj"]}
    run = flightlog.init(out, sinks=["jsonl", "mlflow"], run_name="ml-run", task_type="sft", model_name="tiny-llama", config=config, **QUIET)
    for step in range(1, 21):
        run.log({"loss": 3.0 / step, "grad_norm": float("nan") if step == 4 else 1.0 + step / 10, "stage": "stable", "acc@1": step / 20}, step=step, epoch=step / 10)
        if step % 10 == 0:
            run.log({"eval_loss": 1.5 / step}, step=step)
    run.finish("failed")
    assert flightlog.runfile.read_run_file(out / "logs")["sink_failures"] == {}

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'logs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("flightlog")
    (mlrun,) = client.search_runs([experiment.experiment_id])
    assert mlrun.info.run_name == "ml-run" and mlrun.info.status == "FAILED"
    assert mlrun.data.tags["flightlog.run_id"] == run.run_id
    assert mlrun.data.tags["flightlog.task_type"] == "sft" and mlrun.data.tags["flightlog.model_name"] == "tiny-llama"
    assert mlrun.data.params == {"learning_rate": "0.0002", "lora.r": "8", "lora.alpha": "16", "targets": '["q_proj","v_proj"]'}

    expected: dict[str, list[tuple[int, float]]] = {}
    for record in logged(out / "logs"):
        for key, value in record.items():
            if key not in ("type", "timestamp", "run_id", "step") and not isinstance(value, str):
                expected.setdefault(key.replace("@", "_"), []).append((record["step"], float(value)))
    assert set(mlrun.data.metrics) == set(expected) == {"loss", "grad_norm", "acc_1", "epoch", "eval_loss"}
    for key, points in expected.items():
        assert same(history(client, mlrun.info.run_id, key), sorted(points)), key
    assert math.isnan(dict(history(client, mlrun.info.run_id, "grad_norm"))[4])

    resumed = flightlog.init(out, sinks=["jsonl", "mlflow"], resumed_from_step=15, **QUIET)
    for step in range(16, 24):
        resumed.log({"loss": 0.01 * step}, step=step)
    resumed.finish()
    (again,) = client.search_runs([experiment.experiment_id])
    assert again.info.run_id == mlrun.info.run_id and again.info.status == "FINISHED"
    steps = history(client, again.info.run_id, "loss")
    assert [s for s, _ in steps if s > 20] == [21, 22, 23]
    assert dict(steps)[23] == pytest.approx(0.23)


@pytest.mark.slow
def test_dead_tracking_server_does_not_hurt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts and never answers: train.jsonl stays current, the failure is counted and reported."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        run = flightlog.init(tmp_path, sinks=["jsonl", "mlflow"], mlflow_tracking_uri=uri, **QUIET)
        started = time.monotonic()
        for step in range(1, 101):
            run.log({"loss": 1.0 / step}, step=step)
        assert run.flush(timeout=5.0)
        flushed_after = time.monotonic() - started
        assert len(logged(tmp_path / "logs")) == 100  # on disk while MLflow is still hanging
        (sink,) = [s for s in run.sinks if s.name == "mlflow"]
        assert sink.wait_idle(timeout=30)
        run.log({"loss": 0.001}, step=101)  # the next write reports the stored failure
        run.flush()
        run.finish()
    assert flushed_after < 2.0, f"flush waited {flushed_after:.1f}s on a dead MLflow server"
    meta = flightlog.runfile.read_run_file(tmp_path / "logs")
    assert meta["status"] == "finished" and meta["sink_failures"]["mlflow"] >= 1
    events = logged(tmp_path / "logs", "event")
    assert any("sink 'mlflow' failed" in e["message"] and "cannot start an MLflow run" in e["message"] and uri in e["message"] for e in events)
    assert len(logged(tmp_path / "logs")) == 101
