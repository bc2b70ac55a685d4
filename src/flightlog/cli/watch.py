"""Record a training run that knows nothing of flightlog, live. 'flightlog watch
OUTPUT_DIR' follows an ms-swift, HF, TensorBoard or text-log folder; 'flightlog watch --
COMMAND ARGS...' runs the command, passes its output through unchanged and parses it.
The run is written to OUTPUT_DIR/logs (or --log-dir), shown on the console and checked
by the diagnosis rules as it trains (docs/importers.md)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="*", metavar="OUTPUT_DIR | -- COMMAND", help="the trainer's output directory, or after --: the training command to run")
    parser.add_argument("--format", choices=("ms-swift", "tensorboard", "text", "hf"), help="follow this format (default: detected)")
    parser.add_argument("--log-dir", help="where the flightlog run goes (default: OUTPUT_DIR/logs)")
    parser.add_argument("--name", help="run name (default: the folder's or script's name)")
    parser.add_argument("--idle-timeout", type=float, metavar="SECONDS", help="stop after this long without new records")
    parser.add_argument("--pid", type=int, help="stop when this process (the trainer) exits")
    parser.add_argument("--poll", type=float, default=0.5, metavar="SECONDS", help="how often to look for new data (default: %(default)s)")
    parser.add_argument("--pattern", action="append", default=[], metavar="REGEX", help="a text template: a regex with named groups (step, loss, ...); repeatable")
    parser.add_argument("--rules", metavar="FILE", help="rules YAML for the diagnosis rules (docs/rules.md)")
    parser.add_argument("--no-rules", action="store_true", help="do not run the diagnosis rules")
    parser.add_argument("--notify", action="append", default=[], metavar="URL", help="send alerts here (Slack, DingTalk, Feishu, Alertmanager, webhook); repeatable")
    parser.add_argument("--processor", action="append", default=[], metavar="MODULE:FACTORY", help="add a processor: factory(run) -> processor; repeatable")


def _split(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """One word that is a directory is OUTPUT_DIR; more words, or a program, are the command."""
    words = [w for w in args.target if w != "--"] if args.target[:1] == ["--"] else list(args.target)
    if len(words) == 1 and not Path(words[0]).is_dir() and not (shutil.which(words[0]) or Path(words[0]).is_file()):
        raise ValueError(f"flightlog watch: {words[0]!r} is neither a directory nor a program")
    if len(words) == 1 and Path(words[0]).is_dir():
        return words[0], []
    return None, words


def main(args: argparse.Namespace) -> int:
    try:
        target, command = _split(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if bool(target) == bool(command):
        print("flightlog watch: give either OUTPUT_DIR or '-- COMMAND ARGS...'", file=sys.stderr)
        return 2
    from flightlog.watch.rules import import_factory, rules_available, rules_options

    try:
        factories = [import_factory(spec) for spec in args.processor]
        options = rules_options(enabled=not args.no_rules, spec=args.rules, notify=args.notify)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not args.no_rules and not rules_available():
        print("flightlog watch: diagnosis rules not available in this installation; recording without them", file=sys.stderr)
    try:
        if command:
            from flightlog.watch.command import watch_command

            return watch_command(command, log_dir=args.log_dir, run_name=args.name, patterns=args.pattern, processors=factories, options=options)
        from flightlog.watch.directory import watch_dir

        result = watch_dir(
            target,
            fmt=args.format,
            log_dir=args.log_dir,
            idle_timeout=args.idle_timeout,
            pid=args.pid,
            poll_interval=args.poll,
            patterns=args.pattern,
            processors=factories,
            run_name=args.name,
            options=options,
        )
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"flightlog watch: run {result.run_id} {result.status}: {result.metrics} metrics records in {result.log_dir}")
    return 0 if result.status == "finished" else 1
