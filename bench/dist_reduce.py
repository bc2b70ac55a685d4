"""Time per logging step of flightlog's cross-rank reduction on 2 gloo ranks (CPU).

Compares, for 8 and 64 metrics:
  packed     flightlog's Reducer: one small gather of per-rank figures + ONE packed all-reduce
  run.log    the whole DistributedRun.log at a logging step (reduction + enqueue; no sink)
  per-metric one all_reduce per metric (what a hand-written loop usually does)

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/dist_reduce.py [--steps 300]

Prints a table (median and p90 microseconds per logging step, measured on rank 0).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(n: int, rank: int, step: int) -> dict[str, float]:
    names = ["loss", "grad_norm", "learning_rate", "gpu_memory_peak_mb", "throughput_tokens_per_sec"]
    names += [f"metric_{i}" for i in range(n - len(names))]
    return {k: float(rank + step + i) for i, k in enumerate(names[:n])}


def _time(fn, steps: int) -> list[float]:
    import torch.distributed as dist

    out = []
    for step in range(1, steps + 1):
        dist.barrier()  # every rank enters the step together: we time the collective work, not skew
        t0 = time.perf_counter()
        fn(step)
        out.append((time.perf_counter() - t0) * 1e6)
    return out[20:]  # warm-up dropped


def _worker(rank: int, world: int, port: int, steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    import flightlog

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run = flightlog.init(output_dir=tmp, sinks=[], install_signal_handlers=False, log_level="ERROR")
        reducer = run._reducer
        group = reducer.comm.group
        for n in (8, 64):
            packed = _time(lambda s: reducer(_metrics(n, rank, s), s), steps)
            full = _time(lambda s: run.log(_metrics(n, rank, s), step=s + 1000 * n), steps)

            def per_metric(s: int) -> None:
                out = {}
                for k, v in _metrics(n, rank, s).items():
                    t = torch.tensor([v], dtype=torch.float64)
                    dist.all_reduce(t, group=group)
                    out[k] = t.item() / world

            naive = _time(per_metric, steps)
            rows.append((n, packed, full, naive))
        run.finish()
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, args.steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=600)
    for p in procs:
        p.join()

    def fmt(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=10)
        return f"{statistics.median(xs):9.0f} {q[-1]:7.0f}"

    print(f"2 gloo ranks, {args.steps - 20} logging steps each, microseconds per logging step (median p90)")
    print(f"{'metrics':>7} | {'packed (flightlog)':>18} | {'run.log (full)':>18} | {'per-metric all_reduce':>21} | speed-up")
    for n, packed, full, naive in rows:
        print(f"{n:>7} | {fmt(packed):>18} | {fmt(full):>18} | {fmt(naive):>21} | {statistics.median(naive) / statistics.median(packed):6.1f}x")


if __name__ == "__main__":
    main()
