"""Index existing output folders: every flightlog run below DIR (a folder holding
run.json) is added to the run index under FLIGHTLOG_HOME, or refreshed if it is there.
Folders written by other tools (ms-swift logging.jsonl, HF trainer_state.json,
TensorBoard events) are indexed through the importers when they are installed."""

from __future__ import annotations

import argparse
import sys

from flightlog.cli._runs import CommandError, open_index, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="folders to scan (recursively)")


def _main(args: argparse.Namespace) -> int:
    from flightlog.store.scan import scan

    with open_index(create=True) as index:
        result = scan(args.dirs, index)
        total = index.count()
    for folder, why in result.errors:
        print(f"flightlog: skipped {folder}: {why}", file=sys.stderr)
    for run_id, folder in result.duplicates:
        print(f"flightlog: run {run_id} is also in {folder} (a copy); the index keeps one folder", file=sys.stderr)
    if result.foreign_unhandled:
        print(
            f"flightlog: {len(result.foreign_unhandled)} folder(s) written by other tools were not indexed "
            f"(no importer took them), e.g. {result.foreign_unhandled[0]}",
            file=sys.stderr,
        )
    print(f"indexed {len(result.indexed)} run(s) into {index.path} ({total} in the index)")
    if result.errors and not result.indexed:
        raise CommandError("no run could be indexed")
    return 1 if result.errors else 0


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
