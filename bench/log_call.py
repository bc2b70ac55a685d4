"""Per-call cost of logging 8 scalars, flightlog against what users would use instead.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_TOP_PAD_=67108864 \
        .venv/bin/python bench/log_call.py [--calls 20000] [--only flightlog,queue]

Each tool is timed in this one process, one after the other: ~500 warm-up calls, then
``--calls`` calls each timed with perf_counter_ns, gc disabled during the timed loop;
the fast tools repeat the timed loop 3 times and report the median.
Prints p50/p99 per call, then flightlog's writer throughput (alone, from a filled
queue, and with this thread logging at full speed) and the time from ``finish()``
until every record is durable. See docs/benchmarks.md.
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


def time_calls(log: Callable[[int, dict], None], calls: int, warmup: int = 500, repeats: int = 3) -> tuple[float, float]:
    """Median over ``repeats`` timed loops of (p50, p99) per call, in µs."""
    payloads = [record(i) for i in range(warmup + calls * repeats)]
    for i in range(warmup):
        log(i, payloads[i])
    clock = time.perf_counter_ns
    p50s, p99s = [], []
    for r in range(repeats):
        samples = [0] * calls
        base = warmup + r * calls
        gc.disable()
        try:
            for i in range(calls):
                p = payloads[base + i]
                t = clock()
                log(base + i, p)
                samples[i] = clock() - t
        finally:
            gc.enable()
        samples.sort()
        p50s.append(samples[len(samples) // 2] / 1000)
        p99s.append(samples[int(len(samples) * 0.99)] / 1000)
    return statistics.median(p50s), statistics.median(p99s)


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

    result = time_calls(log, calls, repeats=1)
    writer.close()
    import torch

    return result, f"torch {torch.__version__}"


def bench_wandb(tmp: Path, calls: int):
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ["WANDB_DIR"] = str(tmp)
    import wandb

    run = wandb.init(project="bench", dir=str(tmp))
    result = time_calls(lambda step, m: run.log(m, step=step), calls, repeats=1)
    run.finish()
    return result, f"wandb {wandb.__version__}"


def _mlflow(tmp: Path, calls: int, uri: str, store: str):
    import logging

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    import mlflow

    mlflow.set_tracking_uri(uri)
    with mlflow.start_run():
        result = time_calls(lambda step, m: mlflow.log_metrics(m, step=step), calls, warmup=50, repeats=1)
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


# Writer configurations compared: the recorder alone, and the defaults (diagnosis rules
# and the columnar sidecar on).
WRITER_SETUPS = {
    "core (JSONL; rules=False, columnar=False)": {"rules": False, "columnar": False},
    "JSONL + diagnosis rules (columnar=False)": {"rules": True, "columnar": False},
    "defaults (JSONL + rules + columnar sidecar)": {"rules": True, "columnar": True},
}


def writer_throughput(tmp: Path, n: int = 300_000, **options) -> tuple[float, float]:
    """Records/s the writer thread finishes while a producer logs as fast as it can, and
    seconds from finish() until every record is durable."""
    import flightlog

    out = tmp / f"tp-{len(list(tmp.glob('tp-*')))}"
    run = flightlog.init(output_dir=out, sinks=["jsonl"], install_signal_handlers=False, queue_size=n + 10, flush_interval=1.0, **options)
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


def writer_capacity(tmp: Path, n: int = 300_000, **options) -> tuple[float, float]:
    """Records/s the writer finishes on its own: the queue is filled first (the writer
    thread parked on an event nobody sets), then this thread runs the writer's drain.
    Returns (records per second of wall time, µs of this thread's CPU per record)."""
    import threading

    import flightlog

    out = tmp / f"cap-{len(list(tmp.glob('cap-*')))}"
    run = flightlog.init(output_dir=out, sinks=["jsonl"], install_signal_handlers=False, queue_size=n + 10, flush_interval=60.0, **options)
    run.flush()
    time.sleep(0.2)
    wake = run.queue.wake
    run.queue.wake = threading.Event()
    try:
        for i, p in enumerate(record(i) for i in range(n)):
            run.log(p, step=i + 1)
        gc.collect()
        start, cpu = time.perf_counter(), time.thread_time()
        run.writer._drain()
        run.writer._flush_sinks()
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    finally:
        run.queue.wake = wake
        wake.set()
        run.finish()
    return n / wall, cpu / n * 1e6


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
        print("flightlog writer, 300,000 records of 8 scalars:")
        print("  alone = the queue filled first, then drained by the writer alone (its capacity; median of 3);")
        print("  with producer = while this thread logs them as fast as it can (one GIL for both).")
        print(f"{'':48} {'alone rec/s':>12} {'CPU µs/rec':>11} {'with producer':>14} {'finish->durable':>16}")
        for label, options in WRITER_SETUPS.items():
            # The median of three: this machine's speed changes from one second to the next.
            capacity, cpu = sorted(writer_capacity(tmp, **options) for _ in range(3))[1]
            rate, durable = writer_throughput(tmp, **options)
            print(f"{label:48} {capacity:>12,.0f} {cpu:>11.2f} {rate:>14,.0f} {durable * 1000:>13.1f} ms", flush=True)


if __name__ == "__main__":
    main()
