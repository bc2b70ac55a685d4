"""A real data-parallel training script for tests/test_dist.py (run under torchrun, or
spawned directly with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).

Each rank trains a tiny linear model on its own data shard on the CPU and logs its loss
tensor through flightlog; it also writes the values it logged to ``local-rank-R.json``
so that the test computes the expected reductions independently of flightlog.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import flightlog


def train(args: argparse.Namespace, out: str, mode: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> str:
    """One run: train, log every step through flightlog, write what this rank logged."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())  # plain SGD: torch.optim would import torch._dynamo (seconds)
    run = flightlog.init(
        output_dir=out, run_name="dist-test", sinks=["jsonl"], logging_steps=args.logging_steps,
        rank_streams=args.rank_streams, dist_weight=args.weight, dist_timeout=args.timeout,
        dist_mode=mode, straggler_margin=0.5, straggler_patience=3, install_signal_handlers=False,
    )
    local: dict[int, dict[str, float]] = {}
    status = "ok"
    failed_in = None
    t_log = time.monotonic()
    try:
        with run:
            for step in range(1, args.steps + 1):
                if rank == args.die_rank and step == args.die_step:
                    run.flush()
                    os.kill(os.getpid(), signal.SIGKILL if args.die_how == "kill" else signal.SIGSTOP)
                i = (step * 8) % 64
                loss = torch.nn.functional.mse_loss(model(x[i:i + 8]).squeeze(-1), y[i:i + 8])
                loss.backward()
                with torch.no_grad():
                    for param in params:
                        param -= 0.01 * param.grad
                        param.grad = None
                if rank == args.delay_rank:  # after DDP's synchronised backward: a slow data loader, say
                    time.sleep(args.delay)
                metrics = {
                    "loss": loss.detach(),  # a CPU tensor, as a training loop hands it
                    "num_tokens": 100 * (rank + 1) + step,
                    "gpu_memory_peak_mb": 1000.0 + 10 * rank + step,
                    "throughput_samples_per_sec": 8.0 * (rank + 1),
                    "stage": "stable",
                }
                if rank == args.extra_key_rank:
                    metrics["extra_metric"] = float(rank * 10 + step)
                t_log = time.monotonic()
                run.log(metrics, step=step, epoch=step / args.steps)
                if step % args.logging_steps == 0:
                    local[step] = {k: (float(v) if not isinstance(v, str) else v) for k, v in metrics.items()}
    except flightlog.dist.DistributedTimeout as exc:
        status = f"DistributedTimeout ranks={exc.ranks}"
        failed_in = time.monotonic() - t_log  # from entering the failing log() to the end of the run
    with open(os.path.join(out, f"local-rank-{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world": world, "status": status, "failed_in": failed_in,
                   "steps": {str(k): v for k, v in local.items()}, "type": type(run).__name__}, fh)
    return status


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--logging-steps", type=int, default=1)
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--rank-streams", action="store_true")
    p.add_argument("--weight", default=None, help="dist_weight metric name (num_tokens)")
    p.add_argument("--delay-rank", type=int, default=-1)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--extra-key-rank", type=int, default=-1, help="this rank also logs 'extra_metric'")
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-step", type=int, default=5)
    p.add_argument("--die-how", choices=["kill", "stop"], default="kill")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--mode", default="reduce")
    p.add_argument("--also-figures", action="store_true", help="then a second run with dist_mode=figures")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)  # each rank its own shard
    x = torch.randn(64, 8)
    y = x @ torch.arange(8.0) + 0.1 * torch.randn(64)
    model: torch.nn.Module = torch.nn.Linear(8, 1)
    if args.ddp:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    status = train(args, args.out, args.mode, model, x, y)
    if args.also_figures and status == "ok":  # a second run in the same processes, as the HF callback would log
        status = train(args, os.path.join(args.out, "figures"), "figures", model, x, y)
    if status == "ok":
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
