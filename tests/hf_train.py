"""HF Trainer on a tiny Llama built from a config (no download), recorded by flightlog,
resumed through flightlog.checkpoint.hf. Run as a subprocess by test_checkpoint_hf.py.
``--kill-at N`` SIGKILLs the process when step N ends (after its log, before its save).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

import flightlog
from flightlog.checkpoint.hf import CheckpointCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.data = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class Record(TrainerCallback):
    """Logs the Trainer's losses to flightlog and kills the process on request."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            flightlog.log({k: v for k, v in logs.items() if isinstance(v, (int, float))}, step=state.global_step, epoch=state.epoch)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.kill_at:
            # on_log for this step has not run yet: the kill loses this step's record too,
            # as a real crash would; the resumed run logs it again.
            flightlog.current_run().flush()
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--kill-in-save", type=int, default=None, help="SIGKILL inside the save at this step, after the weights are written")
    p.add_argument("--final", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=32, attention_dropout=0.1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=args.grad_accum, save_steps=args.save_steps, logging_steps=1, learning_rate=3e-3,
        lr_scheduler_type="cosine", warmup_steps=2, seed=0, data_seed=0, report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, save_total_limit=None,
    )
    if args.kill_in_save:
        # A crash in the middle of HF's in-place save: weights written, optimizer not yet.
        original = Trainer._save_optimizer_and_scheduler

        def crash(self, output_dir):
            if self.state.global_step == args.kill_in_save:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, output_dir)

        Trainer._save_optimizer_and_scheduler = crash
    cb = CheckpointCallback()
    resume = cb.resume_from(args.output_dir)
    step = int(resume.rsplit("-", 1)[1]) if resume else None
    flightlog.init(output_dir=args.output_dir, run_name="hf-tiny", sinks=["jsonl"], flush_interval=0.2,
                   install_signal_handlers=False, resumed_from_step=step, max_steps=args.steps)
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(40, 16, 64), callbacks=[Record(args.kill_at), cb])
    trainer.train(resume_from_checkpoint=resume)
    if args.final:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.final)
    flightlog.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
