"""Compare runs side by side: the hyper-parameters that differ and each run's best
metrics, the best value of each metric marked with *. The seeds' LoRA A/B table:

  flightlog compare lora-r8 lora-r32 lora-r64
  flightlog compare --where "task=sft and model~qwen" --metrics eval_acc,loss

RUN is a run id, id prefix, name or run folder."""

from __future__ import annotations

import argparse
from typing import Any

from flightlog.cli._runs import CommandError, find_run, fmt, fmt_duration, open_index, print_table, run_command

_MISSING = object()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN", help="runs to compare (two or more, or use --where)")
    parser.add_argument("--where", "-w", default=None, help="compare the runs matching this filter (see flightlog ls)")
    parser.add_argument("--limit", "-n", type=int, default=20, help="at most N runs from --where (default %(default)s)")
    parser.add_argument("--metrics", "-m", default="", help="only these metrics, comma-separated")
    parser.add_argument("--all", action="store_true", help="show every hyper-parameter, not only those that differ")


def _main(args: argparse.Namespace) -> int:
    from flightlog.protocol import metric_goal

    runs = [find_run(ref) for ref in args.runs]
    if args.where:
        with open_index() as index:
            found = index.query(args.where, limit=args.limit)
            runs += [index.get(r["run_id"]) for r in found]
    seen: set[str] = set()
    runs = [r for r in runs if not (r["run_id"] in seen or seen.add(r["run_id"]))]
    if len(runs) < 2:
        raise CommandError(f"compare needs at least two runs, got {len(runs)}", 2)

    names = [r.get("name") or r["run_id"] for r in runs]
    if len(set(names)) < len(names):
        names = [f"{n} ({r['run_id'][-6:]})" for n, r in zip(names, runs)]
    rows: list[list[str]] = [
        ["status", *[fmt(r["status"]) for r in runs]],
        ["steps", *[fmt(r.get("last_step")) for r in runs]],
        ["duration", *[fmt_duration(r.get("duration_s")) for r in runs]],
    ]
    for field in ("task", "model", "dataset"):
        values = [r.get(field) for r in runs]
        if args.all or len(set(map(str, values))) > 1:
            rows.append([field, *map(fmt, values)])

    keys = sorted(set().union(*(r["params"] for r in runs)))
    for key in keys:
        values = [r["params"].get(key, _MISSING) for r in runs]
        if args.all or len({repr(v) for v in values}) > 1:
            rows.append([key, *["-" if v is _MISSING else fmt(v) for v in values]])

    wanted = [m.strip() for m in args.metrics.split(",") if m.strip()]
    metrics = wanted or sorted(set().union(*(r["best"] for r in runs)))
    for key in metrics:
        values: list[Any] = [(r["best"].get(key) or {}).get("value") for r in runs]
        goal = metric_goal(key)
        numbers = [v for v in values if isinstance(v, (int, float)) and v == v]
        top = (min(numbers) if goal < 0 else max(numbers)) if goal and numbers else None
        cells = [fmt(v) + (" *" if top is not None and v == top and len(numbers) > 1 else "") for v in values]
        rows.append([f"best {key}", *cells])
    print_table(["", *names], rows)
    return 0


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
