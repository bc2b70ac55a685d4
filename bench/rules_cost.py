"""Writer-thread CPU per metrics record spent by the diagnosis rules.

    PYTHONPATH=src python bench/rules_cost.py [--records 100000] [--repeat 3] [--profile]

Feeds the same realistic training records (loss, learning_rate, grad_norm,
grad_norm_adapter, gpu_memory_mb, gpu_memory_total_mb, step_time_s, stage, ...; 9-12
fields) through

* the rules engine directly (``RulesEngine(...)(record)`` on writer-shaped records,
  with the stall watch attached as in a run), and
* a full run's writer, rules on and off: the queue is filled with the items
  ``Run.log`` would enqueue and ``run.writer._drain()`` runs in this thread,

timing each with ``time.thread_time`` (CPU of this thread only, so other load on the
machine does not count). Prints µs per record: each slice of 500 records counts with
its fastest of ``--repeat`` passes (a loaded machine slows some passes down). ``--profile``
prints the cProfile top functions of the direct engine pass instead.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import pstats
import random
import sys
import tempfile
import threading
import time
from typing import Any

from flightlog.protocol import format_timestamp


def make_fields(n: int, seed: int = 0) -> list[tuple[int, float, dict[str, Any]]]:
    """(step, time, fields) of a plausible fine-tuning run: warmup, cosine decay, noise."""
    rng = random.Random(seed)
    warm = 200
    out = []
    t = 1_750_000_000.0
    noise = 0.0
    for i in range(n):
        step = i + 1
        lr = 2e-4 * step / warm if step <= warm else 2e-4 * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / n)))
        noise = 0.2 * noise + rng.gauss(0.0, 0.05)
        loss = 0.9 + 2.5 * math.exp(-step / 5000) + noise
        st = 0.8 * math.exp(rng.gauss(0.0, 0.05))
        t += st
        fields: dict[str, Any] = {
            "loss": loss,
            "learning_rate": lr,
            "grad_norm": 1.2 * math.exp(rng.gauss(0.0, 0.15)),
            "grad_norm_adapter": 0.4 * math.exp(rng.gauss(0.0, 0.15)),
            "gpu_memory_mb": 61440.0 + rng.gauss(0.0, 300.0),
            "gpu_memory_total_mb": 81920.0,
            "step_time_s": st,
            "stage": "warmup" if step <= warm else "train",
            "epoch_progress": step / n,
        }
        if step % 10 == 0:  # every 10th record carries the slower-moving fields too
            fields["data_time_s"] = 0.05 * st
            fields["throughput_samples_per_sec"] = 16 / st
            fields["gpu_memory_peak_mb"] = 65000.0
        out.append((step, t, fields))
    return out


def writer_records(items: list[tuple[int, float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The records the writer hands its observers (type, timestamp, run_id, step, fields)."""
    return [{"type": "metrics", "timestamp": format_timestamp(t), "run_id": "bench", "step": step, **f}
            for step, t, f in items]


CHUNK = 500
"""Records per timed slice. Each slice's time is the minimum over the repeats, so a slice
that another process on the machine slowed down in one repeat does not count."""


def _slices(n: int) -> list[slice]:
    return [slice(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]


def engine_pass(records: list[dict[str, Any]]) -> tuple[list[float], int]:
    """CPU seconds of this thread per slice of ``records`` for the engine, and the alerts it made."""
    from flightlog.rules.config import RulesConfig
    from flightlog.rules.engine import RulesEngine
    from flightlog.rules.stall import StallWatch

    config = RulesConfig()
    emitted: list[dict[str, Any]] = []
    engine = RulesEngine(config, emit=emitted.append, watch=StallWatch(config.stall))
    batch = [dict(r) for r in records]
    times = []
    gc.collect()
    clock = time.thread_time
    for part in _slices(len(batch)):
        start = clock()
        for r in batch[part]:
            engine(r)
        times.append(clock() - start)
    return times, sum(1 for r in emitted if r["type"] == "alert")


def run_pass(items: list[tuple[int, float, dict[str, Any]]], rules: bool) -> list[float]:
    """CPU seconds of this thread per slice of ``items`` for a full writer drain (jsonl sink)."""
    import flightlog

    with tempfile.TemporaryDirectory() as tmp:
        run = flightlog.init(tmp, sinks=["jsonl"], rules=rules, flush_interval=60.0, queue_size=len(items) + 10,
                             install_signal_handlers=False)
        old_wake = run.queue.wake
        times = []
        try:
            run.flush()
            time.sleep(0.2)
            # Park the writer thread on an event nobody sets, so this thread alone drains.
            run.queue.wake = threading.Event()
            queued = [("metrics", t, step, None, dict(f)) for step, t, f in items]
            gc.collect()
            clock = time.thread_time
            for part in _slices(len(queued)):
                start = clock()
                run.queue._items.extend(queued[part])
                run.writer._drain()
                times.append(clock() - start)
        finally:
            run.queue.wake = old_wake
            old_wake.set()
            run.finish()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the direct engine pass")
    args = parser.parse_args(argv)
    if args.records < 1 or args.repeat < 1:
        parser.error("--records and --repeat must be >= 1")

    items = make_fields(args.records)
    records = writer_records(items)
    n = len(items)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        engine_pass(records)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
        return 0

    def best(fn: Any) -> float:
        """µs per record: the sum over slices of each slice's fastest repeat."""
        runs = [fn() for _ in range(args.repeat)]
        return sum(min(times) for times in zip(*runs)) / n * 1e6

    alerts = engine_pass(records)[1]
    engine = best(lambda: engine_pass(records)[0])
    on = best(lambda: run_pass(items, True))
    off = best(lambda: run_pass(items, False))
    print(f"{n} records, {sum(len(f) for _, _, f in items) / n:.1f} fields each; time.thread_time per slice of "
          f"{CHUNK} records, best of {args.repeat}; the engine raised {alerts} alerts")
    print()
    print("| path | µs/record |")
    print("|---|---|")
    print(f"| rules engine alone (`RulesEngine` + stall watch) | {engine:.2f} |")
    print(f"| writer drain, rules on | {on:.2f} |")
    print(f"| writer drain, rules off | {off:.2f} |")
    print(f"| rules' share of the writer (on - off) | {on - off:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
