"""A tiny character-level language model trained on the CPU, recorded by flightlog.

Real PyTorch training (an MLP over the last 16 characters of generated text, AdamW,
linear warmup then cosine decay, gradient clipping, a held-out evaluation) that shows
the seeds' console view and leaves a complete run directory behind.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import flightlog

WORDS = (
    "the model learns to predict the next character of a sentence while flightlog records every step "
    "loss falls learning rate warms up then decays gradient norms stay small checkpoints keep progress safe"
).split()


def make_corpus(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + ". "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)


def lr_at(step: int, base_lr: float, warmup: int, total: int) -> float:
    if step <= warmup:
        return base_lr * step / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base_lr * 0.5 * (1 + math.cos(math.pi * progress))


def train(
    output_dir: str | Path = "output/demo",
    steps: int = 3000,
    batch_size: int = 128,
    context: int = 16,
    lr: float = 3e-3,
    warmup: int = 100,
    logging_steps: int = 10,
    eval_steps: int = 500,
    seed: int = 0,
    sinks: list[Any] | None = None,
) -> flightlog.Run:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    corpus = make_corpus(600_000, seed)
    vocab = sorted(set(corpus))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in corpus], dtype=torch.long)
    split = int(len(data) * 0.9)
    train_data, eval_data = data[:split], data[split:]

    model = nn.Sequential(
        nn.Embedding(len(vocab), 32),
        nn.Flatten(),
        nn.Linear(32 * context, 512),
        nn.GELU(),
        nn.Linear(512, 512),
        nn.GELU(),
        nn.Linear(512, len(vocab)),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s + 1, 1.0, warmup, steps))
    hyper = {
        "steps": steps, "batch_size": batch_size, "context": context, "learning_rate": lr,
        "warmup_steps": warmup, "optimizer": "adamw", "weight_decay": 0.01, "max_grad_norm": 1.0,
        "lr_scheduler": "cosine", "seed": seed, "parameters": sum(p.numel() for p in model.parameters()),
    }
    steps_per_epoch = max(1, len(train_data) // (batch_size * context))
    run = flightlog.init(
        output_dir=output_dir,
        run_name="demo-char-mlp",
        task_type="pretrain",
        model_name="char-mlp-8",
        dataset="generated-sentences",
        config=hyper,
        logging_steps=logging_steps,
        max_steps=steps,
        **({"sinks": sinks} if sinks is not None else {}),
    )
    run.event(f"Loading dataset 'generated-sentences' ({len(corpus)} characters, vocabulary {len(vocab)})...")
    run.event(f"Max steps = {steps}, warmup steps = {warmup}, learning rate = {lr:.0e}")
    gen = torch.Generator().manual_seed(seed)

    def batch(source: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(source) - context - 1, (size,), generator=gen)
        x = torch.stack([source[s : s + context] for s in starts.tolist()])
        y = source[starts + context]
        return x, y

    loss_fn = nn.CrossEntropyLoss()
    run.event("Starting training...")
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        x, y = batch(train_data, batch_size)
        t1 = time.perf_counter()
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        step_time = time.perf_counter() - t0
        run.log(
            {
                "loss": loss.detach(),
                "learning_rate": optimizer.param_groups[0]["lr"],
                "grad_norm": grad_norm,
                "step_time_s": step_time,
                "data_time_s": t1 - t0,
                "throughput_samples_per_sec": batch_size / step_time,
                "throughput_tokens_per_sec": batch_size * context / step_time,
                "stage": "warmup" if step <= warmup else "stable",
                "precision": "fp32",
            },
            step=step,
            epoch=step / steps_per_epoch,
        )
        if step % eval_steps == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                ex, ey = batch(eval_data, 1024)
                logits = model(ex)
                eval_loss = loss_fn(logits, ey).item()
                accuracy = (logits.argmax(-1) == ey).float().mean().item()
            model.train()
            run.log({"eval_loss": eval_loss, "eval_accuracy": accuracy}, step=step, epoch=step / steps_per_epoch)
    run.event("Training finished.")
    run.finish()
    return run
