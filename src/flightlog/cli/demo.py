"""Run a real tiny training on the CPU (a character-level model, about a minute on 2 cores),
recorded by flightlog: the console shows the seeds' view, and OUTPUT_DIR/logs holds
train.jsonl and run.json afterwards."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="output/demo", help="the trainer's output directory (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps (default: %(default)s)")
    parser.add_argument("--logging-steps", type=int, default=50, help="log every N steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("flightlog demo needs PyTorch: pip install torch (or run 'make demo')")
        return 1
    from flightlog.demo.train import train

    run = train(output_dir=args.output_dir, steps=args.steps, logging_steps=args.logging_steps, seed=args.seed)
    print(f"\nflightlog: run {run.run_id} recorded in {run.log_dir}")
    print(f"  jq -c 'select(.type==\"metrics\") | {{step, loss}}' {run.log_dir}/train.jsonl | tail -3")
    return 0
