"""Show one run: what it trained, how it ended (a run whose heartbeat stopped shows as
crashed), its hyper-parameters, best and final metrics, where its logs, checkpoints
and archive are. RUN is a run id, an id prefix, a run name (the latest run of that
name) or the path of a run folder."""

from __future__ import annotations

import argparse
import sys

from flightlog.cli._runs import find_run, fmt, fmt_duration, print_table, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run id, id prefix, name or folder")
    parser.add_argument("--json", action="store_true", help="everything the index knows, as JSON")


def _main(args: argparse.Namespace) -> int:
    run = find_run(args.run)
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps(run, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode() + "\n")
        return 0
    out = sys.stdout
    status = run["status"] or "-"
    if status != run.get("recorded_status"):
        status += f" (run.json says {run.get('recorded_status')}; last heartbeat {run.get('heartbeat')})"
    meta = run.get("meta") or {}
    hardware = meta.get("hardware") or {}
    fields = [
        ("run", f"{run['run_id']}  {run.get('name') or ''}".rstrip()),
        ("status", status),
        ("task", fmt(run.get("task"))),
        ("model", fmt(run.get("model"))),
        ("dataset", fmt(run.get("dataset"))),
        ("start", fmt(run.get("start_time"))),
        ("end", fmt(run.get("end_time"))),
        ("duration", fmt_duration(run.get("duration_s"))),
        ("steps", fmt(run.get("last_step")) + (f" / {meta['max_steps']}" if meta.get("max_steps") else "")),
        ("hardware", _hardware(hardware)),
        ("output dir", fmt(run.get("output_dir"))),
        ("logs", fmt(run.get("stream") or run.get("log_dir"))),
        ("checkpoints", f"{len(run['checkpoints'])}: " + ", ".join(run["checkpoints"][-3:]) if run["checkpoints"] else "-"),
        ("archive", f"{run['archive']} (archived {run.get('archived_at')})" if run.get("archive") else "-"),
    ]
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"{key.ljust(width)}  {value}", file=out)
    if run["params"]:
        print(file=out)
        print_table(["hyper-parameter", "value"], [[k, fmt(v)] for k, v in sorted(run["params"].items())], out)
    keys = sorted(set(run["best"]) | set(run["final"]))
    if keys:
        print(file=out)
        rows = []
        for key in keys:
            best = run["best"].get(key)
            rows.append([key, fmt(best["value"]) if best else "-", fmt(best["step"]) if best else "-", fmt(run["final"].get(key))])
        print_table(["metric", "best", "at step", "final"], rows, out)
    return 0


def _hardware(hw: dict) -> str:
    if not isinstance(hw, dict) or not hw:
        return "-"
    acc = hw.get("accelerator") if isinstance(hw.get("accelerator"), dict) else {}
    parts = []
    if acc:
        name = acc.get("name") or acc.get("model") or acc.get("type")
        parts.append(f"{acc.get('count')} x {name}" if acc.get("count") else str(name))
    if hw.get("world_size"):
        parts.append(f"world size {hw['world_size']}")
    if hw.get("host"):
        parts.append(f"host {hw['host']}")
    return ", ".join(parts) or "-"


def main(args: argparse.Namespace) -> int:
    return run_command(_main, args)
