"""Print (and with --run execute) the command that resumes a run from its newest valid
checkpoint. Checkpoints that are newer but incomplete or corrupt are listed with the
reason they were skipped."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="the trainer's output directory (holds checkpoint-N/ and resume.sh)")
    parser.add_argument("--run", action="store_true", help="execute the command instead of printing it")
    parser.add_argument("--checkpoint", help="resume from this checkpoint instead of the newest valid one")
    parser.add_argument("--args", dest="extra", nargs=argparse.REMAINDER, default=[], help="everything after --args is appended to the command")


def main(args: argparse.Namespace) -> int:
    from flightlog.checkpoint.resume import exec_resume, resume_command, shell_line

    try:
        argv, launch, found, skipped = resume_command(args.output_dir, args.checkpoint)
    except (FileNotFoundError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    argv = argv + list(args.extra or [])
    for verdict in skipped:
        print(f"skipped {verdict.path}: {verdict.reason}", file=sys.stderr)
    if found is None:
        print(f"no valid checkpoint in {args.output_dir}: the command starts the run from the beginning", file=sys.stderr)
    else:
        print(f"resuming from {found}", file=sys.stderr)
    if not args.run:
        print(shell_line(argv, launch))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    exec_resume(argv, launch)
    return 0  # not reached
