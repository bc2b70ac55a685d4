"""Run-store benchmark: load a 1M-record stream, and query 10,000 indexed runs.

    python bench/store_bench.py                    # 1,000,000 records, 10,000 runs
    python bench/store_bench.py --records 200000 --runs 2000 --repeat 1

The stream is written through the real JSONL sink with its columnar sidecar (and once
without, to show the sidecar's cost). Loading compares what users would write
(``pandas.read_json(path, lines=True)``) with the loader before (``reader.load_polars``,
line by line), JSON parsing alone (``sidecar=False``) and ``flightlog.load`` (cold: no
cache under FLIGHTLOG_HOME, the sidecar read as the writer left it), on the same file, in
the same process. The index part times ``RunIndex.query`` and the whole
``flightlog ls --where`` command (a fresh process, Python start-up included).
Prints a table; figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from flightlog.protocol import format_timestamp  # noqa: E402


def records_of(records: int, seed: int = 0):
    """A realistic train.jsonl's records: run_start, seed-named metrics, an eval every 500 steps, events."""
    rng = random.Random(seed)
    t0 = 1_796_000_000.0
    run_id = "20261130-000000-bench0"
    yield {
        "type": "run_start", "timestamp": format_timestamp(t0), "run_id": run_id, "run_name": "bench",
        "task_type": "sft", "model_name": "qwen3-7b", "segment": 0, "resumed_from_step": None,
        "config": {"lora_rank": 32, "lora_alpha": 64, "learning_rate": 2e-5, "per_device_train_batch_size": 1},
    }  # fmt: skip
    n, step = 1, 0
    while n < records - 1:
        step += 1
        t = t0 + step * 0.5
        loss = 2.5 * math.exp(-step / 200_000) + rng.random() * 0.05
        yield {
            "type": "metrics", "timestamp": format_timestamp(t), "run_id": run_id, "step": step,
            "epoch": round(step / 100_000, 5), "loss": loss, "learning_rate": 2e-5 * (1 - step / 2e6),
            "grad_norm": rng.random() * 2, "gpu_memory_mb": 18_000 + rng.randint(0, 500),
            "gpu_memory_peak_mb": 19_000, "throughput_samples_per_sec": 40 + rng.random() * 5,
            "step_time_s": 0.5 + rng.random() * 0.01, "stage": "stable" if step > 1000 else "warmup",
        }  # fmt: skip
        n += 1
        if step % 500 == 0:
            yield {"type": "metrics", "timestamp": format_timestamp(t), "run_id": run_id, "step": step, "eval_loss": loss * 1.1, "eval_accuracy": 1 - loss / 3}
            n += 1
        if step % 5000 == 0:
            yield {"type": "event", "timestamp": format_timestamp(t), "run_id": run_id, "step": step, "level": "INFO", "source": "trainer.py:478", "message": f"saving checkpoint-{step}"}
            n += 1
    yield {"type": "run_end", "timestamp": format_timestamp(t0 + step), "run_id": run_id, "step": step, "status": "finished", "summary": {}}


def write_stream(path: Path, records: int, seed: int = 0, batch: int = 1000) -> list[tuple[str, str, str, str]]:
    """Writes the stream through the real JSONL sink as the writer thread does (batches of
    ``batch`` records): once without the columnar sidecar into a scratch folder, then with
    it into ``path``'s folder. Rows: the time spent in the sink's calls (what the writer
    thread waits for) and the process CPU of each pass (the same records are generated in
    both, so the difference is the sidecar's CPU, its converter thread included)."""
    from flightlog.sinks.jsonl import JsonlSink

    rows = []
    for columnar in (False, True):
        folder = path.parent if columnar else path.parent.parent / "plain"
        gc.collect()
        cpu = time.process_time()
        sink = JsonlSink(folder, fsync="never", columnar=columnar)
        spent, n = 0.0, 0
        source = records_of(records, seed)
        while chunk := [r for _, r in zip(range(batch), source)]:
            n += len(chunk)
            start = time.perf_counter()
            sink.write(chunk)
            spent += time.perf_counter() - start
        start = time.perf_counter()
        sink.close()  # with the sidecar: also waits for its converter thread
        spent += time.perf_counter() - start
        cpu = time.process_time() - cpu
        label = "JSONL sink + columnar sidecar (default)" if columnar else "JSONL sink alone (columnar=False)"
        rows.append((f"writer: {label}", f"{n:,}", f"{spent:.2f}", f"CPU {cpu:.1f} s"))
        if not columnar:
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
    return rows


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, result = math.inf, None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_load(records: int, repeat: int, tmp: Path) -> list[tuple[str, str, str, str]]:
    import pandas as pd

    import flightlog
    from flightlog.store import fastload
    from flightlog.store.reader import load_polars

    path = tmp / "logs" / "train.jsonl"
    path.parent.mkdir(parents=True)
    rows = write_stream(path, records)
    n = int(rows[0][1].replace(",", ""))
    size = path.stat().st_size / 2**20
    cols_dir = path.parent / "train.cols"
    cols = sum(f.stat().st_size for f in cols_dir.iterdir()) / 2**20 if cols_dir.exists() else 0.0
    print(f"stream: {n:,} records, {size:.0f} MiB at {path}; columnar sidecar {cols:.0f} MiB", file=sys.stderr)
    t_pandas, frame = best_of(lambda: pd.read_json(path, lines=True), 1)
    rows.append(("pandas.read_json(lines=True), all records", f"{len(frame):,}", f"{t_pandas:.2f}", "1.0x"))
    del frame
    os.environ["FLIGHTLOG_HOME"] = str(tmp / "home")  # the fast loader's cache lives here
    for label, fn, times in (
        ("before: reader.load_polars (line-by-line, metrics)", lambda: load_polars(path.parent), 1),
        ("JSONL only: load_polars(sidecar=False, cache=False)", lambda: fastload.load_polars(path.parent, cache=False, sidecar=False), 1),
        ("flightlog.load -> pandas (metrics), cold", lambda: flightlog.load(path.parent), repeat),
        ("load_polars (metrics), cold", lambda: fastload.load_polars(path.parent), repeat),
        ("flightlog.load -> pandas, all types, cold", lambda: flightlog.load(path.parent, types=None), repeat),
    ):
        t, frame = best_of(fn, times)
        rows.append((label, f"{len(frame):,}", f"{t:.2f}", f"{t_pandas / t:.1f}x"))
        del frame
    with open(path, "ab") as fh:  # the run goes on: 1% more records appended, not yet in the sidecar
        fh.write(path.read_bytes()[-(path.stat().st_size // 100) :].split(b"\n", 1)[1])
    t, frame = best_of(lambda: flightlog.load(path.parent), repeat)
    rows.append(("flightlog.load, + 1% appended after the sidecar", f"{len(frame):,}", f"{t:.2f}", f"{t_pandas / t:.1f}x"))
    if fastload.fallbacks:
        rows.append(("(fastload fell back to the reader)", str(fastload.fallbacks), "", ""))
    return rows


def synthetic_entry(i: int, rng: random.Random) -> dict:
    from flightlog.store.entry import entry_from_meta

    rank = rng.choice([4, 8, 16, 32, 64, 128])
    task = rng.choice(["sft", "sft", "dpo", "kto", "pretrain", "embedding"])
    start = 1_790_000_000 + i * 600
    acc = min(0.99, 0.4 + 0.08 * math.log2(rank) + rng.random() * 0.1)
    meta = {
        "run_id": f"r{i:06d}-{rng.getrandbits(24):06x}", "run_name": f"{task}-r{rank}-{i}", "task_type": task,
        "model_name": rng.choice(["qwen3-7b", "llama3-8b", "glm4-9b"]), "dataset": rng.choice(["alpaca-en", "sharegpt"]),
        "status": rng.choice(["finished"] * 8 + ["failed", "running"]), "start_time": format_timestamp(start),
        "end_time": format_timestamp(start + rng.randint(600, 36_000)), "heartbeat": format_timestamp(start + 600),
        "heartbeat_interval": 10.0, "last_step": rng.randint(100, 5000), "output_dir": f"/data/runs/{i}",
        "log_dir": f"/data/runs/{i}/logs",
        "config": {
            "lora_rank": rank, "lora_alpha": rank * 2, "learning_rate": rng.choice([1e-5, 2e-5, 5e-5, 1e-4]),
            "per_device_train_batch_size": rng.choice([1, 2, 4]), "gradient_accumulation_steps": rng.choice([4, 8, 16]),
            "max_length": rng.choice([2048, 4096, 8192]), "warmup_ratio": 0.03, "bf16": True, "seed": i,
            "lora": {"dropout": 0.05, "target_modules": "all-linear"}, "optim": "adamw_torch",
        },
    }  # fmt: skip
    summary = {
        "last_step": meta["last_step"],
        "best": {"loss": {"value": 2.0 - acc, "step": 100}, "eval_loss": {"value": 2.1 - acc, "step": 100}, "eval_accuracy": {"value": acc, "step": 100}},
        "last": {"loss": 2.05 - acc, "eval_accuracy": acc - 0.01, "learning_rate": 0.0, "grad_norm": 1.0},
    }
    return entry_from_meta(meta, summary)


def bench_index(runs: int, repeat: int, tmp: Path) -> list[tuple[str, str, str, str]]:
    from flightlog.store.index import RunIndex

    rng = random.Random(1)
    entries = [synthetic_entry(i, rng) for i in range(runs)]
    path = tmp / "home" / "index.sqlite"
    start = time.perf_counter()
    with RunIndex(path) as index:
        for i in range(0, runs, 1000):
            index.upsert_many(entries[i : i + 1000])
    t_build = time.perf_counter() - start
    rows = [(f"index {runs:,} runs (upsert_many)", f"{runs:,}", f"{t_build:.2f}", f"{t_build / runs * 1e6:.0f} us/run")]
    queries = [
        ("task=sft and lora_rank>=32", None),
        ("task=sft and lora_rank>=32 and eval_accuracy>0.8", "-eval_accuracy"),
        ("(model~qwen or model~llama) and learning_rate<5e-5 and status=finished and duration>2h", "-final.loss"),
    ]
    with RunIndex(path) as index:
        for where, sort in queries:
            t, found = best_of(lambda: index.query(where, sort=sort, limit=50), repeat)
            total = len(index.query(where))
            rows.append((f"query --where {where!r}" + (f" --sort {sort}" if sort else ""), f"{total:,} match", f"{t * 1000:.1f} ms", ""))
    env = {**os.environ, "FLIGHTLOG_HOME": str(path.parent), "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "flightlog", "ls", "--where", queries[1][0], "--sort", "eval_accuracy:desc", "-n", "20"]
    t, proc = best_of(lambda: subprocess.run(cmd, env=env, capture_output=True, text=True), repeat)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    rows.append(("flightlog ls --where ... (whole command)", f"{len(proc.stdout.splitlines()) - 1} shown", f"{t * 1000:.0f} ms", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="flightlog-bench-") as tmp:
        rows = [] if args.skip_load else bench_load(args.records, args.repeat, Path(tmp) / "load")
        rows += bench_index(args.runs, args.repeat, Path(tmp) / "index")
    widths = [max(len(r[i]) for r in rows + [("what", "rows", "seconds", "vs pandas")]) for i in range(4)]
    head = ("what", "rows", "time", "speed-up")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
