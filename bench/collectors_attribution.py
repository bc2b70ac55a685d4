"""What each part of flightlog's per-step cost weighs, in one process.

    .venv/bin/python bench/collectors_attribution.py [--rounds 250] [--model mlp|llama]

The loop of ``collectors_overhead.py``. Each round runs a bare block, then each
configuration's block of ``--block`` steps followed by a bare one. A configuration's
figure is the median over the rounds of (its block - the mean of its two bare
neighbours) / that mean; the control compares the last bare block of a round with one
more bare block. Configurations:

* ``all``: StepTimer + every collector, a record every 10 steps (as the overhead bench);
* ``parked``: the same with the writer thread parked for the whole run (its work left out);
* ``timer``: StepTimer and the loss only, no collectors;
* ``plain``: a StepTimer that never logs (the per-step machinery alone).

Every configuration shares the optimizer; the Collectors' pre-step hook is on it only
during a logging step of theirs, so the bare blocks pay nothing of flightlog's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collectors_overhead import LOGGING_STEPS, MALLOC, build_loop  # noqa: E402

KINDS = ("all", "parked", "timer", "plain")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=250)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--model", choices=["mlp", "llama"], default="mlp")
    parser.add_argument("--only", default=",".join(KINDS), help="comma list of configurations")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})
    kinds = [k for k in args.only.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}")

    import flightlog
    from flightlog.collect import Collectors, StepTimer

    model, opt, sched, batches, train_step, batch, tokens = build_loop(args.model)
    block = args.block

    def bare() -> float:
        t0 = time.perf_counter()
        for x, y in batches(block):
            train_step(x, y)
        return time.perf_counter() - t0

    def configure(kind: str):
        run = flightlog.init(output_dir=tempfile.mkdtemp(prefix="fl-attr-"), sinks=["jsonl"], install_signal_handlers=False, logging_steps=LOGGING_STEPS)
        collectors = Collectors(model=model, optimizer=opt, scheduler=sched) if kind in ("all", "parked") else None
        timer = StepTimer(run, collectors=collectors, batch_size=batch, tokens_per_step=tokens, logging_steps=10 ** 9 if kind == "plain" else None)

        def on() -> float:
            t0 = time.perf_counter()
            for x, y in timer.data(batches(block)):
                with timer.step() as step:
                    step.log(loss=train_step(x, y))
            return time.perf_counter() - t0

        return run, on

    configs = {kind: configure(kind) for kind in kinds}
    for _ in range(3):  # warm-up
        for _, on in configs.values():
            bare(), on()
    for kind, (run, _) in configs.items():
        run.flush()
        if kind == "parked":
            run.writer.flush_interval = 1e9  # from its next wake on, it sleeps until finish()
            run.flush()
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds}
    control: list[float] = []
    for _ in range(args.rounds):
        before = bare()
        for kind, (_, on) in configs.items():
            t = on()
            after = bare()
            mean = (before + after) / 2
            ratios[kind].append((t - mean) / mean)
            before = after
        extra = bare()
        control.append((extra - before) / before)
    for run, _ in configs.values():
        run.finish()

    print(f"{args.model} loop, {args.rounds} rounds x {block}-step blocks, record every {LOGGING_STEPS} steps")
    print()
    print("| configuration | overhead (median of rounds) |")
    print("|---|---:|")
    for kind in kinds:
        print(f"| {kind} | {statistics.median(ratios[kind]) * 100:+.2f}% |")
    print(f"| control (bare after bare) | {statistics.median(control) * 100:+.2f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
