"""Print a run's last records, and with -f follow it live until it ends:

  flightlog tail llama3-lora -f
  flightlog tail llama3-lora -f --type metrics --fields loss,learning_rate
  flightlog tail llama3-lora --type event --grep -i nan -n 50

--grep matches the record's JSON line. With -f the command returns when the run
writes its run_end record, or when its heartbeat stops (the run crashed)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from flightlog.cli._runs import CommandError, find_run, fmt, run_command

_ENVELOPE = ("type", "timestamp", "run_id", "step", "epoch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run id, id prefix, name or folder")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new records until the run ends")
    parser.add_argument("-n", "--lines", type=int, default=10, help="records to show first (default %(default)s)")
    parser.add_argument("--type", "-t", action="append", default=None, help="only these record types (repeatable)")
    parser.add_argument("--grep", "-g", default=None, help="only records whose JSON line matches this regular expression")
    parser.add_argument("-i", "--ignore-case", action="store_true", help="case-insensitive --grep")
    parser.add_argument("--fields", default="", help="metrics fields to show, comma-separated (records without any are skipped)")
    parser.add_argument("--json", action="store_true", help="print the records' JSON lines as written")
    parser.add_argument("--poll", type=float, default=0.2, help=argparse.SUPPRESS)


class Filter:
    def __init__(self, types: list[str] | None, grep: str | None, ignore_case: bool, fields: list[str]) -> None:
        try:
            self.grep = re.compile(grep.encode(), re.IGNORECASE if ignore_case else 0) if grep else None
        except re.error as exc:
            raise CommandError(f"bad --grep pattern {grep!r}: {exc}", 2) from None
        self.types = set(types) if types else None
        self.fields = fields

    def __call__(self, line: bytes, record: dict[str, Any]) -> bool:
        if self.types is not None and record.get("type") not in self.types:
            return False
        if self.grep is not None and not self.grep.search(line):
            return False
        if self.fields and record.get("type") == "metrics" and not any(f in record for f in self.fields):
            return False
        return True


def render(record: dict[str, Any], fields: list[str]) -> str:
    """One human line per record (the seeds' console style)."""
    stamp = str(record.get("timestamp", ""))[11:19]
    kind = record.get("type")
    head = f"{stamp} "
    if record.get("step") is not None:
        head += f"step {record['step']} "
    if kind == "metrics":
        keys = fields or [k for k in record if k not in _ENVELOPE]
        return head + " | ".join(f"{k} {fmt(record[k])}" for k in keys if k in record)
    if kind == "event":
        return head + f"[{record.get('level', 'INFO')}] {record.get('source', '')} {record.get('message', '')}".replace("  ", " ")
    if kind == "alert":
        return head + f"ALERT {record.get('severity', '')} {record.get('rule', '')}: {record.get('message', '')}"
    if kind == "checkpoint":
        return head + f"checkpoint {record.get('status')} {record.get('path')}"
    if kind == "run_start":
        return head + f"run_start {record.get('run_name', '')} segment {record.get('segment', 0)}"
    if kind == "run_end":
        return head + f"run_end {record.get('status')}"
    return head + " ".join(f"{k}={fmt(v)}" for k, v in record.items() if k not in ("timestamp", "run_id"))


def _main(args: argparse.Namespace) -> int:
    from flightlog.protocol import RECORD_TYPES, decode
    from flightlog.runfile import effective_status, read_run_file
    from flightlog.store.follow import follow, last_lines

    if args.lines < 0:
        raise CommandError("-n must be >= 0", 2)
    unknown = sorted(set(args.type or []) - RECORD_TYPES)
    if unknown:
        raise CommandError(f"unknown record type(s) {', '.join(unknown)}; known: {', '.join(sorted(RECORD_TYPES))}", 2)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    keep = Filter(args.type, args.grep, args.ignore_case, fields)
    run = find_run(args.run)
    log_dir = Path(run.get("log_dir") or "")
    stream = log_dir / "train.jsonl"
    out = sys.stdout
    ended = False

    def note(record: dict[str, Any]) -> None:
        nonlocal ended
        if record.get("type") == "run_end":
            ended = True
        elif record.get("type") == "run_start":  # a resumed run goes on after an earlier run_end
            ended = False

    def show(line: bytes, record: dict[str, Any]) -> None:
        out.write((line.decode() if args.json else render(record, fields)) + "\n")

    def emit(line: bytes) -> None:
        try:
            record = decode(line) if line.strip() else None
        except ValueError:
            record = None
        if record is None:
            return
        note(record)
        if keep(line, record):
            show(line, record)

    def accepted(line: bytes) -> bool:
        try:
            record = decode(line)
        except ValueError:
            return False
        return keep(line, record)

    if stream.exists():
        shown, offset, seen = last_lines(stream, args.lines, accepted)
        for line in seen:  # the latest run_start / run_end decides whether the run has ended
            if b'"type":"run_end"' in line or b'"type":"run_start"' in line:
                note(decode(line))
    elif any(log_dir.glob("train.*.jsonl.gz")):
        if args.follow:
            raise CommandError(f"run {run['run_id']} writes gzip segments; tail -f follows train.jsonl only (drop -f)")
        import orjson

        from flightlog.protocol import make_finite
        from flightlog.store.reader import read_records

        lines = [orjson.dumps(make_finite(r)) for r in read_records(log_dir, include_superseded=True)]
        kept = [line for line in lines if accepted(line)]
        shown, offset = (kept[len(kept) - args.lines :] if args.lines else []), 0
    else:
        raise CommandError(f"run {run['run_id']} has no stream at {stream}")
    for line in shown:
        show(line, decode(line))
    out.flush()
    if not args.follow:
        return 0

    last_check = [time.monotonic()]

    def stop() -> bool:
        if ended:
            return True
        if time.monotonic() - last_check[0] < 2.0:
            return False
        last_check[0] = time.monotonic()
        meta = read_run_file(log_dir)
        if meta and effective_status(meta) == "crashed":
            print(f"flightlog: run {run['run_id']} stopped beating at {meta.get('heartbeat')} (crashed)", file=sys.stderr)
            return True
        return False

    for line in follow(stream, offset, poll=args.poll, stop=stop):
        emit(line)
        out.flush()
    return 0


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
