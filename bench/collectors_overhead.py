"""Step-time overhead of flightlog with every collector on, in a real CPU training loop.

    .venv/bin/python bench/collectors_overhead.py [--runs 3] [--pairs 20] [--block 100]

(The script pins MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_ as
shared/BENCHMARKING.md asks, re-executing itself if they are not set.)

One process per run. Inside it, blocks of ``--block`` steps of the same model alternate
between the bare loop ("off") and the loop under flightlog ("on": StepTimer + all
Collectors — step/data time, throughput, lr, stage, precision, fused adapter/backbone
gradient norms, psutil on the writer thread; GPU memory skipped on the CPU — one
record every 10 steps with the loss tensor, JSONL sink). Overhead of a run = median over
the pairs of (on - off) / off. The control pairs two "off" blocks: its figure is the
noise floor. Reported: the median of the runs, for wall time and for the process's CPU
time (all threads, the writer's included; far less sensitive to other processes on a
shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MALLOC = {"MALLOC_MMAP_THRESHOLD_": "268435456", "MALLOC_TRIM_THRESHOLD_": "268435456", "MALLOC_TOP_PAD_": "67108864"}
LOGGING_STEPS = 10


def one_run(pairs: int, block: int, control: bool) -> dict[str, float]:
    import torch
    from torch import nn

    import flightlog
    from flightlog.collect import Collectors, StepTimer

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class LoRALinear(nn.Module):
        def __init__(self, n: int, rank: int = 8) -> None:
            super().__init__()
            self.base = nn.Linear(n, n)
            self.lora_A = nn.Linear(n, rank, bias=False)
            self.lora_B = nn.Linear(rank, n, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.lora_B(self.lora_A(x))

    vocab, context, batch = 64, 8, 64
    model = nn.Sequential(
        nn.Embedding(vocab, 16), nn.Flatten(), nn.Linear(16 * context, 128), nn.GELU(),
        LoRALinear(128), nn.GELU(), nn.Linear(128, vocab),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=500)
    loss_fn = nn.CrossEntropyLoss()
    data = torch.randint(0, vocab, (200_000,))

    def batches(n: int):
        starts = torch.randint(0, len(data) - context - 1, (n, batch))
        for row in starts:
            idx = row.unsqueeze(1) + torch.arange(context)
            yield data[idx], data[row + context]

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss

    def block_off() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for x, y in batches(block):
            train_step(x, y)
        return time.perf_counter() - t0, time.process_time() - c0

    out_dir = tempfile.mkdtemp(prefix="fl-bench-")
    run = flightlog.init(output_dir=out_dir, sinks=["jsonl"], install_signal_handlers=False, logging_steps=LOGGING_STEPS)
    timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, scheduler=sched), batch_size=batch, tokens_per_step=batch * context)

    def block_on() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for x, y in timer.data(batches(block)):
            with timer.step() as step:
                step.log(loss=train_step(x, y).detach())
        run.flush()  # the writer's work for this block (JSON, psutil, I/O) is counted in this block
        return time.perf_counter() - t0, time.process_time() - c0

    second = block_off if control else block_on
    for _ in range(3):  # warm-up: allocator, autograd caches, writer thread
        block_off(), second()
    ratios, cpu_ratios, off_total, on_total = [], [], 0.0, 0.0
    for i in range(pairs):
        if i % 2 == 0:
            a, b = block_off(), second()
        else:
            b, a = second(), block_off()
        ratios.append((b[0] - a[0]) / a[0])
        cpu_ratios.append((b[1] - a[1]) / a[1])
        off_total += a[0]
        on_total += b[0]
    run.finish()
    records = sum(1 for line in open(os.path.join(out_dir, "logs", "train.jsonl")) if '"metrics"' in line[:30])
    return {
        "median_pair_overhead": statistics.median(ratios),
        "median_pair_cpu_overhead": statistics.median(cpu_ratios),
        "total_overhead": on_total / off_total - 1,
        "step_ms": 1000 * off_total / (pairs * block),
        "records": records,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--child", choices=["on", "control"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})
    if args.child:
        print(json.dumps(one_run(args.pairs, args.block, args.child == "control")))
        return 0

    results: dict[str, list[dict[str, float]]] = {"on": [], "control": []}
    for _ in range(args.runs):
        for kind in ("control", "on"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--pairs", str(args.pairs), "--block", str(args.block)],
                capture_output=True, text=True, check=True,
            )
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))

    import torch

    import flightlog

    print(f"flightlog {flightlog.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {args.runs} runs x {args.pairs} pairs x {args.block} steps, record every {LOGGING_STEPS} steps")
    print()
    print("| loop | step time (off) | wall-time overhead per run (median of pairs) | median of runs | CPU-time overhead, median of runs |")
    print("|---|---:|---|---:|---:|")
    for kind, label in (("control", "no-logging control (off vs off)"), ("on", "all collectors, log every 10 steps")):
        runs = results[kind]
        per_run = ", ".join(f"{r['median_pair_overhead'] * 100:+.2f}%" for r in runs)
        median = statistics.median(r["median_pair_overhead"] for r in runs)
        step_ms = statistics.median(r["step_ms"] for r in runs)
        cpu = statistics.median(r["median_pair_cpu_overhead"] for r in runs)
        print(f"| {label} | {step_ms:.2f} ms | {per_run} | {median * 100:+.2f}% | {cpu * 100:+.2f}% |")
    print()
    print("records written per 'on' run:", [r["records"] for r in results["on"]],
          "| total-time overhead per 'on' run:", ", ".join(f"{r['total_overhead'] * 100:+.2f}%" for r in results["on"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
