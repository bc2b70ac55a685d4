"""Replay the diagnosis rules over a finished or crashed run and explain what happened:
a timeline of findings, the likely causes and actions, how the run ended, and the best
and last metrics. PATH is a run's log directory, its output directory, a train.jsonl,
or (with the run store's importers) an ms-swift logging.jsonl / HF trainer_state.json."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="run directory, output directory or log file")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json", help="print the report as JSON")
    fmt.add_argument("--markdown", dest="format", action="store_const", const="markdown", help="print the report as Markdown")
    fmt.add_argument("--format", dest="format", choices=("text", "markdown", "json"), default="text")
    parser.add_argument("--rules", metavar="YAML", help="rule thresholds (same file as the run's 'rules' setting)")


def main(args: argparse.Namespace) -> int:
    from flightlog.config import ConfigError
    from flightlog.rules.config import load
    from flightlog.rules.doctor import diagnose, load_path, render_json, render_text

    try:
        config = load(args.rules) if args.rules else None
        records, meta, skipped = load_path(args.path)
    except (OSError, ValueError, ConfigError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    report = diagnose(records, meta, config, skipped_lines=skipped)
    if args.format == "json":
        print(render_json(report))
    else:
        sys.stdout.write(render_text(report, markdown=args.format == "markdown"))
    return 1 if report.ended in ("failed", "crashed") or any(c["severity"] == "critical" for c in report.causes) else 0
