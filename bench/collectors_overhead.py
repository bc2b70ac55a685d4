"""Step-time overhead of flightlog with every collector on, in a real CPU training loop.

    .venv/bin/python bench/collectors_overhead.py [--runs 3] [--pairs 100] [--block 20] [--model mlp|llama]

(The script pins MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_ as
shared/BENCHMARKING.md asks, re-executing itself if they are not set.)

Two loops (``--model``): ``mlp``, a 2-3 ms step where flightlog's fixed per-step and
per-record costs weigh most, and ``llama``, a small LoRA LLaMA (see :func:`build_loop`).
One process per run. Inside it, blocks of ``--block`` steps of the same model alternate
between the bare loop ("off") and the loop under flightlog ("on": StepTimer + all
Collectors — step/data time, throughput, lr, stage, precision, fused adapter/backbone
gradient norms, psutil on the writer thread; GPU memory skipped on the CPU — one
record every 10 steps with the loss tensor, JSONL sink). Wall-time overhead of a run =
median over the pairs of (on - off) / off. CPU-time overhead = the same for the
training thread's CPU time, plus all the CPU time the writer thread used, divided by the
"off" CPU time (so work the writer does between blocks is counted, not lost). The
control pairs two "off" blocks: its figure is the noise floor. The alternative pairs
"off" with the same loop logging the same record by hand with torch's TensorBoard
``SummaryWriter`` (:func:`hand_rolled_tensorboard`), what a plain loop does without
flightlog (``--no-alternative`` skips it). Reported: the median of the runs. A last
child times each piece flightlog adds on its own.
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
from typing import Any

MALLOC = {"MALLOC_MMAP_THRESHOLD_": "268435456", "MALLOC_TRIM_THRESHOLD_": "268435456", "MALLOC_TOP_PAD_": "67108864"}
LOGGING_STEPS = 10


def build_loop(model_kind: str):
    """The model, optimizer, scheduler, batch source and step function of a training loop:
    ``mlp``, an embedding + MLP with a LoRA-style layer (~2-3 ms steps: the stress case,
    where flightlog's per-step cost weighs most), or ``llama``, a small LLaMA built from a
    config (2 layers, hidden 128, 2k vocabulary) with a peft LoRA adapter on q/v and a
    frozen backbone, causal-LM loss on 4 x 64 tokens (the issue's kind of fine-tuning,
    ~15-30 ms steps here)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if model_kind == "llama":
        import peft
        import transformers

        transformers.logging.set_verbosity_error()
        vocab, context, batch = 2048, 64, 4
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=context,
        )
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
        model = peft.get_peft_model(transformers.LlamaForCausalLM(config), lora)
        params = [p for p in model.parameters() if p.requires_grad]
        data = torch.randint(0, vocab, (200_000,))

        def batches(n: int):
            starts = torch.randint(0, len(data) - context, (n, batch))
            for row in starts:
                yield data[row.unsqueeze(1) + torch.arange(context)], None

        def loss_of(x: torch.Tensor, y: Any) -> torch.Tensor:
            return model(input_ids=x, labels=x).loss
    else:
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
        params = list(model.parameters())
        loss_fn = nn.CrossEntropyLoss()
        data = torch.randint(0, vocab, (200_000,))

        def batches(n: int):
            starts = torch.randint(0, len(data) - context - 1, (n, batch))
            for row in starts:
                idx = row.unsqueeze(1) + torch.arange(context)
                yield data[idx], data[row + context]

        def loss_of(x: torch.Tensor, y: Any) -> torch.Tensor:
            return loss_fn(model(x), y)

    opt = torch.optim.AdamW(params, lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=500)

    def train_step(x: torch.Tensor, y: Any) -> torch.Tensor:
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        return loss

    return model, opt, sched, batches, train_step, batch, batch * context


def hand_rolled_tensorboard(model, opt, train_step, batch: int, tokens: int, directory: str):
    """What a user writes instead of flightlog to get the same record every 10 steps:
    timing by hand in the loop, the loss read with ``.item()``, the learning rate, the
    adapter and backbone gradient norms with torch's own ``get_total_norm``, psutil at
    most once a second, every value written with torch's ``SummaryWriter.add_scalar``
    (its event file is written by its own thread). Returns ``one_step(iterator)``, which
    trains on the iterator's next batch (False when it is exhausted), and the writer."""
    import psutil
    import torch
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(directory)
    adapter = [p for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
    backbone = [p for n, p in model.named_parameters() if "lora_" not in n and p.requires_grad]
    process = psutil.Process()
    clock = time.perf_counter
    state = {"step": 0, "step_s": 0.0, "data_s": 0.0, "last_system": 0.0}

    def norm(params: list[Any]) -> float:
        grads = [p.grad for p in params if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0

    def one_step(it: Any) -> bool:
        d0 = clock()
        try:
            x, y = next(it)
        except StopIteration:
            return False
        d1 = clock()
        loss = train_step(x, y)
        state["step"] += 1
        state["data_s"] += d1 - d0
        state["step_s"] += clock() - d0
        step = state["step"]
        if step % LOGGING_STEPS == 0:
            step_s, data_s = state["step_s"] / LOGGING_STEPS, state["data_s"] / LOGGING_STEPS
            state["step_s"] = state["data_s"] = 0.0
            adapter_norm, backbone_norm = norm(adapter), norm(backbone)
            scalars = {
                "loss": loss.item(), "learning_rate": opt.param_groups[0]["lr"],
                "grad_norm": (adapter_norm ** 2 + backbone_norm ** 2) ** 0.5,
                "grad_norm_adapter": adapter_norm, "grad_norm_backbone": backbone_norm,
                "step_time_s": step_s, "data_time_s": data_s,
                "throughput_samples_per_sec": batch / step_s, "throughput_tokens_per_sec": tokens / step_s,
            }
            now = time.monotonic()
            if now - state["last_system"] >= 1.0:
                state["last_system"] = now
                scalars["cpu_percent"] = process.cpu_percent()
                scalars["process_rss_mb"] = process.memory_info().rss / 2**20
                scalars["disk_used_percent"] = psutil.disk_usage(directory).percent
            for key, value in scalars.items():
                writer.add_scalar(f"train/{key}", value, step)
        return True

    return one_step, writer


def one_run(pairs: int, block: int, kind: str, components: bool = False, without: frozenset[str] = frozenset(), model_kind: str = "mlp") -> dict[str, float]:
    import flightlog
    from flightlog.collect import Collectors, StepTimer

    model, opt, sched, batches, train_step, batch, tokens = build_loop(model_kind)

    def block_off() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        for x, y in batches(block):
            train_step(x, y)
        return time.perf_counter() - t0, time.thread_time() - c0

    out_dir = tempfile.mkdtemp(prefix="fl-bench-")
    run = flightlog.init(output_dir=out_dir, sinks=["jsonl"], install_signal_handlers=False, logging_steps=LOGGING_STEPS)
    collectors = None if "collectors" in without else Collectors(
        model=model, optimizer=opt, scheduler=sched, grad_norms="grads" not in without, system="system" not in without
    )
    timer = StepTimer(run, collectors=collectors, batch_size=batch, tokens_per_step=tokens)

    def block_on() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        for x, y in timer.data(batches(block)):
            with timer.step() as step:
                step.log(loss=train_step(x, y))  # no .detach(): read only on logging steps
        return time.perf_counter() - t0, time.thread_time() - c0

    if components:
        return component_costs(model, opt, sched, run, timer, block_off, block)

    tensorboard = None
    if kind == "tensorboard":
        tensorboard_step, tensorboard = hand_rolled_tensorboard(model, opt, train_step, batch, tokens, os.path.join(out_dir, "tb"))

        def second() -> tuple[float, float]:
            t0, c0 = time.perf_counter(), time.thread_time()
            it = iter(batches(block))
            while tensorboard_step(it):
                pass
            return time.perf_counter() - t0, time.thread_time() - c0
    else:
        second = block_off if kind == "control" else block_on
    for _ in range(3):  # warm-up: allocator, autograd caches, writer thread
        block_off(), second()
    run.flush()  # the writer's first-record work (rule plans, first psutil read) is warm-up too
    if tensorboard is not None:
        tensorboard.flush()
    ratios, cpu_ratios, off_total, on_total, off_cpu = [], [], 0.0, 0.0, 0.0
    # The CPU time of the threads other than this one (flightlog's writer, or the
    # SummaryWriter's event-file thread): the process's, less this thread's.
    process_start, thread_start = time.process_time(), time.thread_time()
    for i in range(pairs):
        if i % 2 == 0:
            a, b = block_off(), second()
        else:
            b, a = second(), block_off()
        ratios.append((b[0] - a[0]) / a[0])
        cpu_ratios.append((b[1] - a[1]) / a[1])
        off_total += a[0]
        on_total += b[0]
        off_cpu += a[1]
    run.flush()
    if tensorboard is not None:
        tensorboard.flush()
    writer_cpu = (time.process_time() - process_start) - (time.thread_time() - thread_start)
    run.finish()
    if tensorboard is not None:
        tensorboard.close()
    records = sum(1 for line in open(os.path.join(out_dir, "logs", "train.jsonl")) if '"metrics"' in line[:30])
    return {
        "median_pair_overhead": statistics.median(ratios),
        # training thread's CPU time (paired) + the other threads' CPU time over the same steps
        "median_pair_cpu_overhead": statistics.median(cpu_ratios) + writer_cpu / off_cpu,
        "writer_cpu_share": writer_cpu / off_cpu,
        "total_overhead": on_total / off_total - 1,
        "step_ms": 1000 * off_total / (pairs * block),
        "records": records,
    }


def component_costs(model, opt, sched, run, timer, block_off, block) -> dict[str, float]:
    """Each piece flightlog adds, timed alone (best of 5 repetitions, in microseconds)."""
    from flightlog.collect import Collectors, SystemStats

    def best(fn, n: int, reps: int = 5) -> float:
        out = []
        for _ in range(reps):
            fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - t0) / n * 1e6)
        return min(out)

    block_off()  # leaves gradients in place for the norm
    step_us = min(block_off()[0] for _ in range(3)) / block * 1e6
    collectors = Collectors(model=model, optimizer=opt, scheduler=sched, system=False)
    collect_us = best(lambda: collectors.collect(10), 500)
    bare = flightlog_timer_only(run)
    timer_us = best(bare, 5000)
    log_us = best(lambda: run.log({"loss": 1.0, "step_time_s": 0.1}), 5000)
    psutil_us = best(SystemStats(".").read, 200)
    run.finish()
    per_step = timer_us + (collect_us + log_us) / LOGGING_STEPS
    return {
        "step_us": step_us, "timer_us": timer_us, "collect_us": collect_us, "log_us": log_us,
        "psutil_us": psutil_us, "per_step_us": per_step, "per_step_pct": 100 * per_step / step_us,
    }


def flightlog_timer_only(run):
    from flightlog.collect import StepTimer

    timer = StepTimer(run, logging_steps=10 ** 9)  # never emits: the per-step machinery alone
    it = timer.data(iter(int, 1))

    def step() -> None:
        next(it)
        with timer.step() as s:
            s.log(loss=1.0)

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--without", default="", help="comma list of parts to leave out of 'on': grads, system, collectors (to see what costs what)")
    parser.add_argument("--no-control", action="store_true", help="skip the control runs")
    parser.add_argument("--model", choices=["mlp", "llama"], default="mlp", help="mlp: the 2-3 ms stress loop; llama: a small LoRA LLaMA (needs the hf extra)")
    parser.add_argument("--no-alternative", action="store_true", help="skip the hand-rolled TensorBoard loop")
    parser.add_argument("--child", choices=["on", "control", "tensorboard", "components"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})
    if args.child:
        without = frozenset(w for w in args.without.split(",") if w)
        print(json.dumps(one_run(args.pairs, args.block, args.child, args.child == "components", without, args.model)))
        return 0

    results: dict[str, list[dict[str, float]]] = {"on": [], "control": [], "tensorboard": []}
    kinds = ["on"] if args.no_control else ["control", "on"]
    if not args.no_alternative:
        kinds.append("tensorboard")
    for _ in range(args.runs):
        for kind in kinds:
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--pairs", str(args.pairs), "--block", str(args.block), "--without", args.without, "--model", args.model],
                capture_output=True, text=True, check=True,
            )
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))

    out = subprocess.run([sys.executable, __file__, "--child", "components", "--block", str(args.block), "--model", args.model], capture_output=True, text=True, check=True)
    parts = json.loads(out.stdout.strip().splitlines()[-1])

    import torch

    import flightlog

    print(f"flightlog {flightlog.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {args.model} loop, {args.runs} runs x {args.pairs} pairs x {args.block} steps, record every {LOGGING_STEPS} steps")
    print()
    print("| loop | step time (off) | wall-time overhead per run (median of pairs) | median of runs | CPU-time overhead, median of runs |")
    print("|---|---:|---|---:|---:|")
    on_label = f"without {args.without}" if args.without else "all collectors, log every 10 steps"
    alternative = "instead: the same record by hand, torch SummaryWriter (TensorBoard)"
    for kind, label in (("control", "no-logging control (off vs off)"), ("on", on_label), ("tensorboard", alternative)):
        runs = results[kind]
        if not runs:
            continue
        per_run = ", ".join(f"{r['median_pair_overhead'] * 100:+.2f}%" for r in runs)
        median = statistics.median(r["median_pair_overhead"] for r in runs)
        step_ms = statistics.median(r["step_ms"] for r in runs)
        cpu = statistics.median(r["median_pair_cpu_overhead"] for r in runs)
        print(f"| {label} | {step_ms:.2f} ms | {per_run} | {median * 100:+.2f}% | {cpu * 100:+.2f}% |")
    print()
    print("records written per 'on' run:", [r["records"] for r in results["on"]],
          "| writer thread CPU / training CPU:", ", ".join(f"{r['writer_cpu_share'] * 100:.2f}%" for r in results["on"]),
          "| (SummaryWriter's thread:", ", ".join(f"{r['writer_cpu_share'] * 100:.2f}%" for r in results["tensorboard"]) + ")",
          "| total-time overhead per 'on' run:", ", ".join(f"{r['total_overhead'] * 100:+.2f}%" for r in results["on"]))
    print()
    print("Each piece timed alone (best of 5, same model):")
    print()
    print("| piece | cost | paid |")
    print("|---|---:|---|")
    print(f"| bare training step | {parts['step_us']:.0f} µs | every step |")
    print(f"| StepTimer (data wrapper + step context) | {parts['timer_us']:.2f} µs | every step |")
    print(f"| Collectors.collect (lr, stage, precision, fused grad norms) | {parts['collect_us']:.1f} µs | every {LOGGING_STEPS} steps |")
    print(f"| run.log of the record | {parts['log_us']:.2f} µs | every {LOGGING_STEPS} steps |")
    print(f"| psutil sample (writer thread) | {parts['psutil_us']:.0f} µs | at most once a second |")
    print(f"| training thread, per step | {parts['per_step_us']:.1f} µs = {parts['per_step_pct']:.2f}% of a step | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
