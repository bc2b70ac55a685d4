"""Step-time overhead of logging in a real CPU training loop, flightlog against the alternatives.

    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_TOP_PAD_=67108864 \
        .venv/bin/python bench/step_overhead.py [--blocks 20] [--block-steps 100] [--repeats 3]

One process trains a small MLP (a few ms a step on the CPU). Blocks of ``--block-steps``
steps alternate between logging switched off and on (8 scalars every step) for each
tool; the overhead is the median over block pairs of (on - off) / off, and the figure
is the median of ``--repeats`` runs. A "no logging" control runs the same pairing with
logging off in both halves: its figure shows the noise and should read about 0%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


def make_loop():
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(128, 256)
    y = torch.randint(0, 10, (128,))

    def step() -> dict[str, Any]:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return {"loss": loss.detach(), "grad_norm": norm}

    return step


def metrics(step: int, out: dict[str, Any]) -> dict[str, float]:
    return {
        "loss": out["loss"], "grad_norm": out["grad_norm"], "learning_rate": 1e-3, "step_time_s": 0.002,
        "data_time_s": 0.0001, "throughput_samples_per_sec": 64000.0, "epoch": step / 1000, "gpu_memory_mb": 0.0,
    }


def tool_flightlog(tmp: Path):
    import flightlog

    run = flightlog.init(output_dir=tmp / "fl", sinks=["jsonl"], install_signal_handlers=False)
    return (lambda step, m: run.log(m, step=step)), run.finish, f"flightlog {flightlog.__version__}"


def tool_orjson(tmp: Path):
    import orjson

    fh = open(tmp / "sync.jsonl", "wb")

    def log(step, m):
        fh.write(orjson.dumps({"step": step, **{k: float(v) for k, v in m.items()}}) + b"\n")

    return log, fh.close, f"orjson {orjson.__version__}"


def tool_tensorboard(tmp: Path):
    import torch
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp / "tb"))

    def log(step, m):
        for k, v in m.items():
            writer.add_scalar(k, v, step)

    return log, writer.close, f"torch {torch.__version__} SummaryWriter"


def tool_wandb(tmp: Path):
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp))
    import wandb

    run = wandb.init(project="bench", dir=str(tmp))
    return (lambda step, m: run.log({k: float(v) for k, v in m.items()}, step=step)), run.finish, f"wandb {wandb.__version__} offline"


TOOLS: dict[str, Callable] = {"flightlog": tool_flightlog, "orjson-sync": tool_orjson, "tensorboard": tool_tensorboard, "wandb": tool_wandb}


def paired_overhead(step_fn, log: Callable | None, blocks: int, block_steps: int) -> float:
    """Median over block pairs of (time with logging - time without) / time without."""
    ratios = []
    counter = 0
    for _ in range(blocks):
        times = []
        for logging_on in (False, True):
            start = time.perf_counter()
            for _ in range(block_steps):
                counter += 1
                out = step_fn()
                if logging_on and log is not None:
                    log(counter, metrics(counter, out))
            times.append(time.perf_counter() - start)
        ratios.append((times[1] - times[0]) / times[0])
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block-steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="control," + ",".join(TOOLS))
    args = parser.parse_args()
    step_fn = make_loop()
    for _ in range(50):
        step_fn()
    start = time.perf_counter()
    for _ in range(200):
        step_fn()
    step_ms = (time.perf_counter() - start) / 200 * 1000
    print(f"python {sys.version.split()[0]}, step {step_ms:.2f} ms on the CPU, {args.repeats} x {args.blocks} block pairs of {args.block_steps} steps, log every step")
    print(f"{'tool':14} {'overhead':>9}  runs                       version")
    with tempfile.TemporaryDirectory() as d:
        for name in args.only.split(","):
            results = []
            version = ""
            for r in range(args.repeats):
                if name == "control":
                    log, close, version = None, (lambda: None), "logging off in both halves"
                else:
                    try:
                        tool_dir = Path(d) / f"{name}-{r}"
                        tool_dir.mkdir()
                        log, close, version = TOOLS[name](tool_dir)
                    except ImportError as exc:
                        version = f"not installed ({exc.name})"
                        break
                results.append(paired_overhead(step_fn, log, args.blocks, args.block_steps))
                close()
            if not results:
                print(f"{name:14} {'-':>9}  {version}")
                continue
            runs = ", ".join(f"{x * 100:+.1f}%" for x in results)
            print(f"{name:14} {statistics.median(results) * 100:>+8.1f}%  {runs:26} {version}", flush=True)


if __name__ == "__main__":
    main()
