"""Per-call cost of logging 8 scalars, flightlog against what users would use instead.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_TOP_PAD_=67108864 \
        .venv/bin/python bench/log_call.py [--calls 20000] [--only flightlog,queue]

Each tool is timed in this one process, one after the other: ~500 warm-up calls, then
``--calls`` calls each timed with perf_counter_ns, gc disabled during the timed loop.
Prints p50/p99 per call, then flightlog's writer throughput and the time from
``finish()`` until every record is durable. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

METRICS = ("loss", "learning_rate", "grad_norm", "step_time_s", "data_time_s", "throughput_samples_per_sec", "gpu_memory_mb", "epoch_progress")


def record(step: int) -> dict[str, float]:
    return {name: 1.0 / (step + i + 1) for i, name in enumerate(METRICS)}


def time_calls(log: Callable[[int, dict], None], calls: int, warmup: int = 500) -> tuple[float, float]:
    payloads = [record(i) for i in range(calls + warmup)]
    for i in range(warmup):
        log(i, payloads[i])
    samples = [0] * calls
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(calls):
            p = payloads[warmup + i]
            t = clock()
            log(warmup + i, p)
            samples[i] = clock() - t
    finally:
        gc.enable()
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def bench_queue(tmp: Path, calls: int):
    q: queue.SimpleQueue = queue.SimpleQueue()
    return time_calls(lambda step, m: q.put(m), calls), None


def bench_flightlog(tmp: Path, calls: int):
    import flightlog

    run = flightlog.init(output_dir=tmp / "fl", sinks=["jsonl"], install_signal_handlers=False)
    result = time_calls(lambda step, m: run.log(m, step=step), calls)
    run.finish()
    return result, None


def bench_json_write(tmp: Path, calls: int):
    fh = open(tmp / "stdlib.jsonl", "w")
    result = time_calls(lambda step, m: fh.write(json.dumps({"step": step, **m}) + "\n"), calls)
    fh.close()
    return result, None


def bench_orjson_write(tmp: Path, calls: int):
    import orjson

    fh = open(tmp / "orjson.jsonl", "wb")
    result = time_calls(lambda step, m: fh.write(orjson.dumps({"step": step, **m}) + b"\n"), calls)
    fh.close()
    return result, None


def bench_tensorboard(tmp: Path, calls: int):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp / "tb"))

    def log(step, m):
        for k, v in m.items():
            writer.add_scalar(k, v, step)

    result = time_calls(log, calls)
    writer.close()
    import torch

    return result, f"torch {torch.__version__}"


def bench_wandb(tmp: Path, calls: int):
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ["WANDB_DIR"] = str(tmp)
    import wandb

    run = wandb.init(project="bench", dir=str(tmp))
    result = time_calls(lambda step, m: run.log(m, step=step), calls)
    run.finish()
    return result, f"wandb {wandb.__version__}"


def _mlflow(tmp: Path, calls: int, uri: str, store: str):
    import logging

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    import mlflow

    mlflow.set_tracking_uri(uri)
    with mlflow.start_run():
        result = time_calls(lambda step, m: mlflow.log_metrics(m, step=step), calls, warmup=50)
    return result, f"mlflow {mlflow.__version__} ({store})"


def bench_mlflow(tmp: Path, calls: int):
    return _mlflow(tmp, calls, (tmp / "mlruns").as_uri(), "file store")


def bench_mlflow_sqlite(tmp: Path, calls: int):
    return _mlflow(tmp, calls, f"sqlite:///{tmp / 'mlflow.db'}", "sqlite store")


TOOLS = {
    "queue": ("queue.SimpleQueue.put (floor)", bench_queue),
    "flightlog": ("flightlog Run.log", bench_flightlog),
    "orjson": ("orjson.dumps + file write (sync)", bench_orjson_write),
    "json": ("json.dumps + file write (sync)", bench_json_write),
    "tensorboard": ("TensorBoard SummaryWriter, 8 x add_scalar", bench_tensorboard),
    "wandb": ("wandb offline run.log", bench_wandb),
    "mlflow": ("mlflow log_metrics, file store", bench_mlflow),
    "mlflow-sqlite": ("mlflow log_metrics, sqlite store", bench_mlflow_sqlite),
}
SLOW = {"tensorboard": 4000, "wandb": 2000, "mlflow": 400, "mlflow-sqlite": 100}


def writer_throughput(tmp: Path, n: int = 300_000, columnar: bool = True) -> tuple[float, float]:
    """Records/s the writer thread turns into JSONL (and, by default, the columnar sidecar
    of train.jsonl), and seconds from finish() to durable."""
    import flightlog

    run = flightlog.init(
        output_dir=tmp / f"tp-{columnar}", sinks=["jsonl"], install_signal_handlers=False, queue_size=n + 10, flush_interval=1.0, columnar=columnar
    )
    payloads = [record(i) for i in range(n)]
    run.flush()
    start = time.perf_counter()
    for i, p in enumerate(payloads):
        run.log(p, step=i + 1)
    enqueued = time.perf_counter()
    run.flush(timeout=120)
    drained = time.perf_counter()
    for i in range(1000):
        run.log(payloads[i], step=n + i + 1)
    t_finish = time.perf_counter()
    run.finish()
    durable = time.perf_counter() - t_finish
    metrics = sum(1 for line in open(run.log_dir / "train.jsonl", "rb") if line.startswith(b'{"type":"metrics"'))
    assert metrics == n + 1000, metrics  # (the diagnosis rules may add alerts and events)
    return n / (drained - start), durable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--only", default=",".join(TOOLS))
    args = parser.parse_args()
    import platform

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}")
    print(f"{'tool':48} {'calls':>7} {'p50 µs':>9} {'p99 µs':>9}  version")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for key in args.only.split(","):
            label, fn = TOOLS[key]
            calls = min(args.calls, SLOW.get(key, args.calls))
            try:
                (p50, p99), version = fn(tmp, calls)
            except ImportError as exc:
                print(f"{label:48} {'-':>7} {'-':>9} {'-':>9}  not installed ({exc.name})")
                continue
            print(f"{label:48} {calls:>7} {p50:>9.2f} {p99:>9.2f}  {version or ''}", flush=True)
        print()
        for columnar in (False, True):
            rate, durable = writer_throughput(tmp, columnar=columnar)
            what = "JSONL + columnar sidecar (the default)" if columnar else "JSONL only (columnar=False)"
            print(f"flightlog writer throughput, {what}: {rate:,.0f} records/s (300,000 records of 8 scalars)")
            print(f"flightlog finish() until every record is durable (fsync), {what}: {durable * 1000:.1f} ms")


if __name__ == "__main__":
    main()
