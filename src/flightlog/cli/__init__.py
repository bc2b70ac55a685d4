"""The ``flightlog`` command: a thin shell over library functions.

Each subcommand lives in its own module under ``flightlog.cli`` with two functions:
``add_arguments(parser)`` and ``main(args) -> int``, and is listed in ``COMMANDS``.
Modules import their heavy dependencies inside ``main``, so ``flightlog --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("flightlog.cli.demo", "run a real tiny training on the CPU, recorded by flightlog"),
    "watch": ("flightlog.cli.watch", "record a run that knows nothing of flightlog: follow OUTPUT_DIR, or run -- COMMAND"),
    "doctor": ("flightlog.cli.doctor", "replay the diagnosis rules over a run and explain what happened"),
    "alerts": ("flightlog.cli.alerts", "alerting helpers: prometheus-rules writes Prometheus alerting rules"),
    "index": ("flightlog.cli.index", "add the runs found under folders to the run index"),
    "ls": ("flightlog.cli.ls", "list indexed runs, filtered (--where) and sorted"),
    "show": ("flightlog.cli.show", "show one run: status, hyper-parameters, best metrics, paths"),
    "compare": ("flightlog.cli.compare", "compare runs: differing hyper-parameters and best metrics side by side"),
    "export": ("flightlog.cli.export", "export a run's records as CSV, Parquet or JSON Lines"),
    "tail": ("flightlog.cli.tail", "print a run's last records; -f follows it live"),
    "archive": ("flightlog.cli.archive", "archive a run as a verified tar.gz to a folder or fsspec URL"),
    "resume": ("flightlog.cli.resume", "print (or --run) the command resuming a run from its newest valid checkpoint"),
}


def build_parser() -> argparse.ArgumentParser:
    from flightlog import __version__

    parser = argparse.ArgumentParser(
        prog="flightlog",
        description="flightlog: the flight recorder and cockpit of model-training runs.",
    )
    parser.add_argument("--version", action="version", version=f"flightlog {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(command)
        command.set_defaults(_main=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
