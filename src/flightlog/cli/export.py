"""Export a run's records (metrics by default) as CSV, Parquet or JSON Lines, with
superseded records hidden as in flightlog.load:

  flightlog export llama3-lora --format csv -o metrics.csv
  flightlog export llama3-lora --format parquet --type all -o run.parquet

Without -o, CSV and JSON Lines go to stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flightlog.cli._runs import CommandError, find_run, run_command

FORMATS = ("csv", "parquet", "jsonl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run id, id prefix, name or folder")
    parser.add_argument("--format", "-f", choices=FORMATS, default=None, help="default: from the -o suffix")
    parser.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")
    parser.add_argument("--type", "-t", action="append", default=None, help="record types (repeatable; 'all' for every type; default metrics)")
    parser.add_argument("--include-superseded", action="store_true", help="also records a resumed run made obsolete")


def _main(args: argparse.Namespace) -> int:
    from flightlog.protocol import RECORD_TYPES

    fmt = args.format or (Path(args.output).suffix.lstrip(".") if args.output else None)
    if fmt not in FORMATS:
        raise CommandError(f"say --format {'|'.join(FORMATS)} (cannot tell it from {args.output or 'stdout'!r})", 2)
    if fmt == "parquet" and not args.output:
        raise CommandError("parquet is binary: give -o FILE", 2)
    types = args.type or ["metrics"]
    if "all" in types:
        types = sorted(RECORD_TYPES)
    unknown = sorted(set(types) - RECORD_TYPES)
    if unknown:
        raise CommandError(f"unknown record type(s) {', '.join(unknown)}; known: {', '.join(sorted(RECORD_TYPES))}, all", 2)
    run = find_run(args.run)
    log_dir = run.get("log_dir")
    if not log_dir or not Path(log_dir).is_dir():
        where = f"; it is archived at {run['archive']} (flightlog archive --restore)" if run.get("archive") else ""
        raise CommandError(f"the logs of run {run['run_id']} are not at {log_dir}{where}")
    count = export(log_dir, fmt, args.output, types, args.include_superseded)
    if args.output:
        print(f"wrote {count} records of run {run['run_id']} to {args.output}", file=sys.stderr)
    return 0


def export(log_dir: str, fmt: str, output: str | None, types: list[str], include_superseded: bool = False) -> int:
    """Write the records; returns how many."""
    import warnings

    if fmt == "jsonl":
        from flightlog.protocol import encode, make_finite
        from flightlog.store.reader import read_records

        out = open(output, "wb") if output else sys.stdout.buffer
        count = 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for record in read_records(log_dir, types=types, include_superseded=include_superseded):
                    out.write(encode(make_finite(record)))
                    count += 1
        finally:
            if output:
                out.close()
            else:
                out.flush()
        return count

    import polars as pl

    from flightlog.store.fastload import load_polars

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = load_polars(log_dir, types=types, include_superseded=include_superseded)
    if fmt == "parquet":
        frame.write_parquet(output)
        return frame.height
    frame = _flat(frame, pl)
    if output:
        frame.write_csv(output)
    else:
        sys.stdout.write(frame.write_csv())
    return frame.height


def _flat(frame, pl):  # type: ignore[no-untyped-def]
    """CSV holds scalars only: nested values (config, summaries) become JSON text."""
    casts = []
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Struct):
            casts.append(pl.col(name).struct.json_encode())
        elif isinstance(dtype, (pl.List, pl.Array)):
            casts.append(pl.col(name).map_elements(lambda v: _json(v.to_list()), return_dtype=pl.String))
        elif isinstance(dtype, pl.Datetime):
            casts.append(pl.col(name).dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"))
    return frame.with_columns(casts) if casts else frame


def _json(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
