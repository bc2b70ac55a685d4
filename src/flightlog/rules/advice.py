"""What each rule means, its likely causes and what to do: the seeds' diagnosis tables.

One table, shared by the live alerts (their ``action`` field), the doctor report and the
docs, so the advice a user reads is the same wherever it shows up. The texts follow
the ms-swift documents in ``seeds/`` (loss/gradient pattern tables, the OOM checklist,
the stalled-training checklist, the QLoRA and cyclic-schedule cases).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Advice:
    pattern: str
    """What the rule saw, in the seeds' words."""
    causes: tuple[str, ...]
    action: str
    """The suggested action, one line (goes into the alert record)."""


ADVICE: dict[str, Advice] = {
    "nonfinite": Advice(
        "loss or gradient norm is NaN/Inf",
        ("gradient explosion", "fp16 overflow", "invalid tokens (e.g. \\x00) or empty samples in the data"),
        "stop and resume from the last good checkpoint with a lower learning rate and --max_grad_norm 1.0; "
        "prefer --bf16 over fp16; check the dataset for empty lines or garbled text",
    ),
    "loss_spike": Advice(
        "loss jumps in one step (seeds: single-step jump > 1.0, e.g. 1.82 -> 3.41 -> 2.95)",
        ("invalid tokens in the data (e.g. \\x00)", "gradient explosion"),
        "clip gradients with --max_grad_norm 1.0; check the dataset for empty lines, garbled text or invalid tokens",
    ),
    "loss_plateau": Advice(
        "loss constant (change < 0.0005 over 50 steps, e.g. 2.1423 -> 2.1421 -> 2.1420)",
        ("learning rate too low", "wrong data labels", "LoRA adapter not loaded"),
        "check --learning_rate (7B models commonly use 1e-4 to 5e-4); load the data with --dataset_num_proc 1 "
        "to verify its format; check that the LoRA adapter is attached and trainable",
    ),
    "loss_oscillation": Advice(
        "loss swings up and down (peak-valley > 0.5, e.g. 1.2 -> 1.8 -> 1.3 -> 1.9)",
        ("learning rate too high", "batch size too small", "uneven data distribution"),
        "lower --learning_rate by 50%; increase --per_device_train_batch_size; enable --group_by_length true",
    ),
    "loss_rising": Advice(
        "loss keeps rising (seeds: 10 consecutive rises)",
        ("divergence: learning rate too high", "gradient explosion", "corrupted data shard"),
        "lower --learning_rate, clip with --max_grad_norm 1.0, and resume from the last checkpoint before the rise",
    ),
    "grad_explosion": Advice(
        "gradient norm > 5.0: possible gradient explosion",
        ("learning rate too high", "no gradient clipping", "bad batch"),
        "enable clipping (--max_grad_norm 1.0 / --gradient_clip_val 1.0) and lower the learning rate",
    ),
    "grad_vanishing": Advice(
        "gradient norm < 0.01: possible vanishing gradients",
        ("learning rate far too low or zero", "frozen parameters", "saturated activations / bad initialisation"),
        "check that the trainable parameters require grad and the learning rate is not zero; raise the learning rate",
    ),
    "adapter_stalled": Advice(
        "adapter gradients near zero while the backbone is frozen (seeds' QLoRA case: grad_norm_adapter 1.2e-6)",
        ("LoRA rank too low for the task", "learning rate too low for the adapter"),
        "raise the LoRA rank (e.g. --lora_rank 8 -> 32) or the learning rate",
    ),
    "memory_pressure": Advice(
        "GPU memory above 95% of the device: OOM risk",
        ("batch too large", "long sequences (max_length)", "optimizer state (AdamW ~3x parameters)"),
        "lower --per_device_train_batch_size (double --gradient_accumulation_steps); enable --bf16; "
        "use --deepspeed zero2; lower --max_length or use --packing true; gradient checkpointing; --optim adafactor",
    ),
    "slow_step": Advice(
        "step time doubled against the recent median",
        ("data loading / I/O bottleneck", "GPU memory fragmentation", "slow or full storage"),
        "check data loading (--dataset_num_proc about 0.8 x CPU cores), storage I/O (iostat -x 1, df -h), "
        "and cache remote datasets locally",
    ),
    "stall": Advice(
        "no new step for much longer than the usual step time: training is stuck",
        ("dataloader deadlock (dataset_num_proc larger than the CPU count)", "slow NFS/disk during checkpoint writes",
         "remote dataset over a flaky network", "a rank waiting in a collective (one rank behind)"),
        "check nvidia-smi utilisation, free disk (df -h, > 50GB) and iostat; set --dataset_num_proc to 0.8 x CPU cores; "
        "download the dataset locally (swift download --dataset ...)",
    ),
    "cyclic_lr": Advice(
        "loss peaks line up with learning-rate peaks",
        ("a cyclic learning-rate schedule used where a decay (cosine) was meant",),
        "check --lr_scheduler_type (e.g. cosine) and the scheduler's cycle settings",
    ),
    "warmup": Advice(
        "loss swings while the learning rate is still warming up",
        ("linear warmup: the learning rate is rising",),
        "expected during warmup; no action needed",
    ),
}


def advice_for(rule: str) -> Advice:
    """The advice for a rule; rules without an entry (user alerts) get a neutral one."""
    return ADVICE.get(rule) or Advice(rule, (), "")
