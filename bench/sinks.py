"""Writer-thread cost of the optional sinks, against what users would call instead.

    .venv/bin/python bench/sinks.py [--records 5000] [--remote-records 1000]

Each row pushes the same metrics records (8 numeric fields and one string, HF-like)
through one sink's ``write`` in batches of 256, as the writer thread does, then
``flush``/``close``, and reports records per second and microseconds per record. The
"instead" rows do the same work through the tool's own API, the way an HF callback
would (torch's ``SummaryWriter.add_scalar`` per value; ``prometheus_client`` gauges per
metric). W&B (offline) and MLflow (SQLite) rows time until the sink's own thread has
delivered everything (``wait_idle``) and use fewer records. None of this runs on the
training thread: ``Run.log`` costs the same whichever sinks are configured.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from flightlog.protocol import format_timestamp  # noqa: E402

METRICS = ("loss", "learning_rate", "grad_norm", "step_time_s", "data_time_s", "throughput_samples_per_sec", "gpu_memory_mb", "epoch")
BATCH = 256


def records(n: int) -> list[dict[str, Any]]:
    now = time.time()
    out = [{"type": "run_start", "timestamp": format_timestamp(now), "run_id": "bench", "run_name": "bench", "config": {"lr": 1e-4, "lora": {"r": 8}}}]
    for step in range(1, n + 1):
        rec: dict[str, Any] = {"type": "metrics", "timestamp": format_timestamp(now + step * 0.01), "run_id": "bench", "step": step}
        rec.update({name: 1.0 / (step + i + 1) for i, name in enumerate(METRICS)})
        rec["stage"] = "stable"
        out.append(rec)
    return out


def drive(sink: Any, batch_records: list[dict[str, Any]], finish: Callable[[Any], None]) -> float:
    started = time.perf_counter()
    for i in range(0, len(batch_records), BATCH):
        sink.write(batch_records[i : i + BATCH])
    finish(sink)
    return time.perf_counter() - started


def row(name: str, n: int, seconds: float) -> None:
    print(f"| {name:<44} | {n:>7} | {n / seconds:>12,.0f} | {seconds / n * 1e6:>9.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--remote-records", type=int, default=1000)
    parser.add_argument("--only", default="", help="comma-separated row prefixes")
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    local, remote = records(args.records), records(args.remote_records)
    tmp = Path(tempfile.mkdtemp(prefix="flightlog-bench-sinks-"))
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")

    print("| sink | records | records/s | us/record |")
    print("|---|---:|---:|---:|")

    def want(name: str) -> bool:
        return not only or any(name.startswith(o) for o in only)

    if want("tensorboard"):
        from flightlog.sinks.tensorboard import TensorBoardSink

        seconds = drive(TensorBoardSink(tmp / "tb"), local, lambda s: s.close())
        row("tensorboard (flightlog, EventFileWriter)", args.records, seconds)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            SummaryWriter = None
        if SummaryWriter is not None:
            writer = SummaryWriter(str(tmp / "tb-torch"))
            started = time.perf_counter()
            for rec in local[1:]:
                for name in METRICS:
                    writer.add_scalar(f"train/{name}", rec[name], rec["step"])
            writer.close()
            row("instead: torch SummaryWriter.add_scalar", args.records, time.perf_counter() - started)

    if want("prometheus"):
        from flightlog.sinks.prometheus import PrometheusSink

        sink = PrometheusSink(port=0, run_name="bench", run_id="bench")
        seconds = drive(sink, local, lambda s: None)  # closing is the HTTP server's shutdown, not per-record work
        sink.close()
        row("prometheus (flightlog exporter)", args.records, seconds)
        from prometheus_client import CollectorRegistry, Gauge

        registry = CollectorRegistry()
        gauges = {name: Gauge(f"bench_{name}", name, ["run"], registry=registry).labels(run="bench") for name in METRICS}
        started = time.perf_counter()
        for rec in local[1:]:
            for name in METRICS:
                gauges[name].set(rec[name])
        row("instead: prometheus_client Gauge.set", args.records, time.perf_counter() - started)

    if want("wandb"):
        from flightlog.sinks._background import BackgroundSink
        from flightlog.sinks.wandb import WandbBackend

        sink = BackgroundSink(WandbBackend(project="bench", directory=tmp / "wandb"), name="wandb")
        seconds = drive(sink, remote, lambda s: (s.wait_idle(600), s.close()))
        row("wandb offline (incl. wandb.init + finish)", args.remote_records, seconds)

    if want("mlflow"):
        from flightlog.sinks._background import BackgroundSink
        from flightlog.sinks.mlflow import MlflowBackend

        sink = BackgroundSink(MlflowBackend(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", experiment="bench"), name="mlflow")
        seconds = drive(sink, remote, lambda s: (s.wait_idle(600), s.close()))
        row("mlflow sqlite (incl. import + DB creation)", args.remote_records, seconds)


if __name__ == "__main__":
    main()
