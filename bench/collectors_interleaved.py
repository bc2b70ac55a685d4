"""Step-time overhead of all collectors, with the loops interleaved step by step.

    .venv/bin/python bench/collectors_interleaved.py [--runs 3] [--rounds 3000] [--model mlp|llama]

The loops of ``collectors_overhead.py`` (same model, data and step function), but
instead of alternating blocks of steps, a run alternates single steps of two loops:
the bare loop, and one of: a second bare loop (the control), the loop under flightlog
(StepTimer + every Collector, a record every 10 of its steps, JSONL sink), or the same
record by hand with torch's ``SummaryWriter`` (:func:`collectors_overhead.hand_rolled_tensorboard`).
Neighbouring steps share the machine's state of the moment (clock frequency, a
neighbour's load), so slow drifts cancel, which block pairs of a 20 ms step could not
do here. Each run is a process of its own, with one loop beside the bare one: a
background thread (flightlog's writer, the SummaryWriter's event thread) must not
spill its work into another tool's steps.

Each loop's steps are cut into groups of 10 of its own steps (one record each) and
compared with the bare loop's steps of the same rounds. A run's figure is the 5%-trimmed
mean of (group / bare group - 1), for wall time and for the training thread's CPU time.
The background thread's CPU time is shown as a share of the bare loop's: it runs beside
both loops, so the step-by-step wall figure shares its effect out between them; adding
its whole CPU time to the wall figure gives the bound for all of it coming out of the
training thread's time.
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
import threading
import time
from itertools import chain, repeat
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collectors_overhead import LOGGING_STEPS, MALLOC, build_loop, hand_rolled_tensorboard  # noqa: E402

KINDS = ("control", "flightlog", "tensorboard")


def trimmed_mean(values: list[float], cut: float = 0.05) -> float:
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    return statistics.fmean(ordered[k : len(ordered) - k])


def one_run(rounds: int, model_kind: str, kind: str) -> dict[str, Any]:
    """One process: the bare loop and the ``kind`` loop, a step of each a round."""
    import flightlog
    from flightlog.collect import Collectors, StepTimer

    model, opt, sched, batches, train_step, batch, tokens = build_loop(model_kind)
    source = chain.from_iterable(map(batches, repeat(1000)))  # one endless stream of batches for both loops

    def bare() -> None:
        x, y = next(source)
        train_step(x, y)

    def control() -> None:  # the same code as bare(), a function of its own
        x, y = next(source)
        train_step(x, y)

    background: Callable[[], float] = lambda: 0.0  # noqa: E731  (CPU seconds of the loop's own thread)
    finish: Callable[[], None] = lambda: None  # noqa: E731
    settle: Callable[[], None] = lambda: None  # noqa: E731
    out_dir = tempfile.mkdtemp(prefix="fl-inter-")
    if kind == "flightlog":
        run = flightlog.init(output_dir=out_dir, sinks=["jsonl"], install_signal_handlers=False, logging_steps=LOGGING_STEPS)
        timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, scheduler=sched), batch_size=batch, tokens_per_step=tokens)
        timed = timer.data(source)

        def other() -> None:
            x, y = next(timed)
            with timer.step() as step:
                step.log(loss=train_step(x, y))

        writer_clock = time.pthread_getcpuclockid(run.writer._thread.ident)
        background, finish, settle = (lambda: time.clock_gettime(writer_clock)), run.finish, run.flush
    elif kind == "tensorboard":
        tensorboard_step, tensorboard = hand_rolled_tensorboard(model, opt, train_step, batch, tokens, os.path.join(out_dir, "tb"))

        def other() -> None:
            tensorboard_step(source)

        main_thread = time.pthread_getcpuclockid(threading.main_thread().ident)
        background = lambda: time.process_time() - time.clock_gettime(main_thread)  # noqa: E731  (the event thread)
        finish, settle = tensorboard.close, tensorboard.flush
    else:
        other = control

    wall: dict[str, list[float]] = {"bare": [], kind: []}
    cpu: dict[str, list[float]] = {"bare": [], kind: []}
    clock, thread_clock = time.perf_counter, time.thread_time
    for _ in range(3 * LOGGING_STEPS):  # warm-up: allocator, autograd caches, the writer's first records
        bare(), other()
    settle()
    background_start = background()
    forward, backward = (("bare", bare), (kind, other)), ((kind, other), ("bare", bare))
    for i in range(rounds):
        for name, fn in forward if i % 2 == 0 else backward:
            w0, c0 = clock(), thread_clock()
            fn()
            wall[name].append(clock() - w0)
            cpu[name].append(thread_clock() - c0)
    settle()
    background_cpu = background() - background_start
    finish()

    def overhead(times: dict[str, list[float]]) -> float:
        mine, reference = times[kind], times["bare"]
        groups = range(0, rounds - LOGGING_STEPS + 1, LOGGING_STEPS)
        return trimmed_mean([sum(mine[g : g + LOGGING_STEPS]) / sum(reference[g : g + LOGGING_STEPS]) - 1 for g in groups])

    return {
        "step_ms": 1000 * statistics.median(wall["bare"]),
        "wall": overhead(wall),
        "cpu": overhead(cpu),
        "background": background_cpu / sum(cpu["bare"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--model", choices=["mlp", "llama"], default="mlp", help="mlp: the 2-3 ms stress loop; llama: a small LoRA LLaMA (needs the hf extra)")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 10 * LOGGING_STEPS:
        parser.error(f"--rounds must be at least {10 * LOGGING_STEPS}")
    if any(os.environ.get(k) != v for k, v in MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})
    if args.child:
        print(json.dumps(one_run(args.rounds, args.model, args.child)))
        return 0

    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for _ in range(args.runs):
        for kind in KINDS:  # one process a run and loop
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--rounds", str(args.rounds), "--model", args.model],
                capture_output=True, text=True, check=True,
            )
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))

    import torch

    import flightlog

    step_ms = statistics.median(r["step_ms"] for rs in results.values() for r in rs)
    print(f"flightlog {flightlog.__version__}, torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{args.model} loop ({step_ms:.2f} ms a bare step), {args.runs} runs x {args.rounds} rounds, a bare step and a step "
          f"of the loop measured each round, record every {LOGGING_STEPS} steps")
    print()
    print("| loop | wall-time overhead per run | wall, median of runs | training-thread CPU, median | background thread's CPU | wall + background CPU |")
    print("|---|---|---:|---:|---:|---:|")
    labels = {
        "control": "no-logging control (bare vs bare)",
        "flightlog": "flightlog: StepTimer + all collectors",
        "tensorboard": "instead: the same record by hand, torch SummaryWriter",
    }
    for kind, label in labels.items():
        runs = results[kind]
        per_run = ", ".join(f"{r['wall'] * 100:+.2f}%" for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        background = statistics.median(r["background"] for r in runs)
        print(f"| {label} | {per_run} | {wall * 100:+.2f}% | {cpu * 100:+.2f}% | {background * 100:.2f}% | {(wall + background) * 100:+.2f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
