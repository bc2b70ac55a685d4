"""A deterministic CPU training driven by CheckpointManager, run as a subprocess by the
checkpoint tests and bench/kill_resume.py. It can kill itself with SIGKILL at a given
step (--kill-at) or in the middle of a checkpoint save (--kill-in-save STEP:STAGE), and
resumes by itself from the newest valid checkpoint when launched again.

Every generator the loop draws from is used (dropout: torch CPU RNG; input noise: NumPy;
a jitter: Python's random), so an incomplete RNG restore changes the losses.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import sys

import numpy as np
import torch
from torch import nn

from flightlog.checkpoint import CheckpointManager, EpochSampler


def build(seed: int, width: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Dropout(0.2), nn.Linear(width, 1))
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(56, 8, generator=g)
    y = (x[:, :1] * 0.7 - x[:, 1:2] ** 2 + 0.1 * torch.randn(56, 1, generator=g))
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=EpochSampler(dataset, seed=seed))
    return model, loader


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--save-total-limit", type=int, default=None)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--kill-at", type=int, default=None, help="SIGKILL right after logging this step (before its save)")
    p.add_argument("--kill-in-save", default=None, help="STEP:N: SIGKILL after the N-th stage of the save at STEP")
    p.add_argument("--final", default=None, help="write the final model and optimizer state here")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:  # under torchrun: DDP over gloo, each rank its own shard and random streams
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    model, loader = build(args.seed, args.width)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        sampler = torch.utils.data.DistributedSampler(loader.dataset, seed=args.seed, drop_last=True)
        loader = torch.utils.data.DataLoader(loader.dataset, batch_size=4, sampler=sampler)
        torch.manual_seed(args.seed + 1000 * rank)  # different dropout masks per rank
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5) * max(0.1, 1 - s / args.steps))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)

    kill_step, kill_stage = (int(v) for v in args.kill_in_save.split(":")) if args.kill_in_save else (None, None)
    stages = []

    def progress(step: int, stage: str) -> None:
        if step == kill_step:
            stages.append(stage)
            if len(stages) == kill_stage:
                kill_self()

    mgr = CheckpointManager(
        args.output_dir, model=model, optimizer=opt, scheduler=sched, scaler=scaler, save_steps=args.save_steps,
        save_total_limit=args.save_total_limit, max_steps=args.steps, async_save=args.async_save, progress=progress,
        metric_for_best="loss", config=vars(args),
    )
    run = mgr.init_run(run_name="ckpt-test", sinks=["jsonl"], flush_interval=0.2, install_signal_handlers=False)
    step = mgr.global_step
    loss_fn = nn.MSELoss()
    for epoch in itertools.count(mgr.epoch):
        if step >= args.steps:
            break
        for x, y in mgr.epoch_batches(loader, epoch):
            x = x + torch.from_numpy(np.random.randn(*x.shape).astype(np.float32)) * 0.05
            x = x * (1.0 + random.uniform(-0.01, 0.01))
            loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            run.log({"loss": loss.item(), "learning_rate": sched.get_last_lr()[0]}, step=step, epoch=epoch)
            if step == args.kill_at:
                run.flush()
                kill_self()
            mgr.step(step, metrics={"loss": loss.item()})
            if step >= args.steps:
                break
    mgr.close()
    if args.final and rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict(), "sched": sched.state_dict()}, args.final)
    run.finish()
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


def chain(plan_file: str, report_file: str) -> int:
    """Run several launches of ``main`` in forked children (torch is imported once, which
    keeps the tests fast) and report, after each, how it ended and what a resume would pick.

    Each child is a real separate process; a kill is a real SIGKILL of that process.
    """
    import json

    from flightlog.checkpoint import find_latest_valid

    plan = json.loads(open(plan_file).read())
    report = []
    # Its first call imports torch's compiler stack (seconds): pay that once, before forking.
    torch.use_deterministic_algorithms(True)
    for argv in plan:
        pid = os.fork()
        if pid == 0:
            # The command a user would have typed: the kill is an outside event, not part of it.
            from flightlog.checkpoint.resume import with_resume_arg

            sys.argv = [os.path.abspath(__file__), *with_resume_arg(with_resume_arg(argv, "--kill-at", None), "--kill-in-save", None)]
            try:
                code = main(argv)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        out = argv[argv.index("--output-dir") + 1]
        latest, skipped = find_latest_valid(out)
        report.append({
            "argv": argv,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "rc": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "latest": latest.name if latest else None,
            "skipped": [[v.path.name, v.reason] for v in skipped],
            "entries": sorted(p for p in os.listdir(out)),
        })
    with open(report_file, "w") as fh:
        json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--chain"]:
        sys.exit(chain(sys.argv[2], sys.argv[3]))
    sys.exit(main())
