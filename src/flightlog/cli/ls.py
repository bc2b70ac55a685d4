"""List indexed runs, newest first, filtered and sorted by run fields, hyper-parameters
and best/final metrics:

  flightlog ls --where "task=sft and lora_rank>=32" --sort eval_acc:desc
  flightlog ls --where "status=crashed or (model~qwen and duration>2h)"

Fields: run_id name model task dataset status start end duration steps source
output_dir log_dir archive; any hyper-parameter (nested ones as lora.rank, or
param.X); metrics as best.X / final.X (a bare metric name means its best value).
Operators: = != < <= > >= ~ (contains, or glob with * ? [) !~, joined by and/or/not
and parentheses; quote values with spaces."""

from __future__ import annotations

import argparse
import sys

from flightlog.cli._runs import CommandError, fmt, fmt_duration, open_index, print_table, run_command

DEFAULT_COLUMNS = ("run_id", "name", "task", "model", "status", "start", "duration", "steps")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--where", "-w", default=None, help='filter, e.g. "task=sft and lora_rank>=32"')
    parser.add_argument("--sort", "-s", action="append", default=[], help="field to sort by; FIELD:desc or --sort=-FIELD for descending (repeatable)")
    parser.add_argument("--limit", "-n", type=int, default=50, help="at most N runs (0: all; default %(default)s)")
    parser.add_argument("--columns", "-c", default="", help="extra columns, comma-separated (hyper-parameters, best.X, final.X)")
    parser.add_argument("--json", action="store_true", help="one JSON object a run (for scripts)")


def _main(args: argparse.Namespace) -> int:
    from flightlog.store.index import sort_key
    from flightlog.store.where import compares, parse

    if args.limit < 0:
        raise CommandError("--limit must be >= 0", 2)
    extra = [c.strip() for c in args.columns.split(",") if c.strip()]
    with open_index() as index:
        rows = index.query(args.where, sort=args.sort, limit=(args.limit or None), columns=extra)
        total = index.count() if args.limit and len(rows) == args.limit else None
        headers = list(DEFAULT_COLUMNS)
        named = [c.field for c in compares(parse(args.where))] if args.where and args.where.strip() else []
        named += [sort_key(s)[0] for part in args.sort for s in part.split(",") if s.strip()] + extra
        for name in named:
            label = index.field(name)[2]
            if label not in headers:
                headers.append(label)
    if args.json:
        import orjson

        for row in rows:
            sys.stdout.write(orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
        return 0
    table = []
    for row in rows:
        cells = []
        for h in headers:
            value = row.get(h)
            if h == "duration":
                cells.append(fmt_duration(value))
            elif h == "start" and value:
                cells.append(str(value)[:16].replace("T", " "))
            else:
                cells.append(fmt(value))
        table.append(cells)
    print_table(headers, table)
    if total is not None and total > len(rows):
        print(f"(showing {len(rows)} runs; --limit 0 for all)", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
