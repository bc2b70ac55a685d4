"""Alerting helpers. `flightlog alerts prometheus-rules` writes Prometheus alerting rules
(stall, NaN/Inf, loss spike and jump, OOM risk, gradient explosion) over the flightlog
exporter's metrics, with the thresholds of a rules YAML; check them with
`promtool check rules FILE`."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="alerts_command", metavar="SUBCOMMAND")
    prom = sub.add_parser("prometheus-rules", help="write a Prometheus rules file over the exporter's metrics")
    prom.add_argument("-o", "--output", help="file to write (default: stdout)")
    prom.add_argument("--rules", metavar="YAML", help="rule thresholds (same file as the run's 'rules' setting)")
    prom.add_argument("--stall-seconds", type=float, default=600.0, help="no new step for this long fires the stall alert (default: %(default)s)")
    prom.add_argument("--matchers", default="", help='label matchers added to every selector, e.g. \'job="train"\'')
    prom.add_argument("--for", dest="for_", default="1m", help="'for' duration of the slower rules (default: %(default)s)")
    prom.add_argument("--group", default="flightlog", help="rule group name (default: %(default)s)")


def main(args: argparse.Namespace) -> int:
    if args.alerts_command != "prometheus-rules":
        print("usage: flightlog alerts prometheus-rules [-o FILE] [--rules YAML] [--stall-seconds S]", file=sys.stderr)
        return 2
    from flightlog.config import ConfigError
    from flightlog.rules.config import load
    from flightlog.rules.promrules import build_rules, render

    if args.stall_seconds <= 0:
        print("flightlog alerts: --stall-seconds must be > 0", file=sys.stderr)
        return 2
    try:
        config = load(args.rules) if args.rules else None
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    text = render(build_rules(config, stall_seconds=args.stall_seconds, matchers=args.matchers, for_=args.for_, group=args.group))
    if args.output:
        from pathlib import Path

        from flightlog.runfile import write_atomic

        write_atomic(Path(args.output), text.encode("utf-8"), fsync=False)
        print(f"wrote {args.output}; check it with: promtool check rules {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
