"""One run as the index sees it: a flat entry built from ``run.json`` (and its stream).

The writer hands over its in-memory summary; a scan of an existing folder reads the
summary that ``finish`` wrote into ``run.json``, or computes it from ``train.jsonl``
when the run never finished (crashed, still running).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from flightlog.protocol import NONFINITE_STRINGS, RUN_FILE, STREAM_FILE, parse_timestamp

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"lora": {"rank": 8}}`` -> ``{"lora.rank": 8}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def as_number(value: Any) -> float | None:
    """A float for numbers, booleans and numeric strings; None otherwise (NaN included)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        if value in NONFINITE_STRINGS:
            number = NONFINITE_STRINGS[value]
        else:
            try:
                number = float(value)
            except ValueError:
                return None
    else:
        return None
    return None if math.isnan(number) else number


def _ts(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_timestamp(text)
    except ValueError:
        return None


def checkpoints(output_dir: str | os.PathLike[str] | None) -> list[str]:
    """``checkpoint-N`` folders of a trainer's output directory, by step."""
    if not output_dir:
        return []
    try:
        names = [(int(m.group(1)), e.path) for e in os.scandir(output_dir) if e.is_dir() and (m := _CHECKPOINT.match(e.name))]
    except OSError:
        return []
    return [path for _, path in sorted(names)]


def entry_from_meta(meta: Mapping[str, Any], summary: Mapping[str, Any] | None = None, source: str = "flightlog") -> dict[str, Any]:
    """The index entry for a run, from its ``run.json`` dict and a summary (last/best)."""
    run_id = meta.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run.json has no run_id")
    summary = summary if summary is not None else meta.get("summary") or {}
    start_ts = _ts(meta.get("start_time"))
    end_ts = _ts(meta.get("end_time"))
    beat_ts = _ts(meta.get("heartbeat"))
    last_ts = end_ts if end_ts is not None else beat_ts
    log_dir = meta.get("log_dir")
    config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    best = {}
    for key, item in (summary.get("best") or {}).items():
        if isinstance(item, Mapping):
            best[key] = (item.get("value"), item.get("step"))
    last_step = meta.get("last_step", summary.get("last_step"))
    return {
        "run_id": run_id,
        "name": meta.get("run_name"),
        "model": meta.get("model_name"),
        "task": meta.get("task_type"),
        "dataset": meta.get("dataset") if not isinstance(meta.get("dataset"), (list, dict)) else str(meta.get("dataset")),
        "status": meta.get("status"),
        "heartbeat": meta.get("heartbeat"),
        "heartbeat_interval": as_number(meta.get("heartbeat_interval")),
        "start_time": meta.get("start_time"),
        "end_time": meta.get("end_time"),
        "start_ts": start_ts,
        "end_ts": end_ts,
        "duration_s": (last_ts - start_ts) if (start_ts is not None and last_ts is not None) else None,
        "last_step": last_step if isinstance(last_step, int) else None,
        "output_dir": meta.get("output_dir"),
        "log_dir": log_dir,
        "stream": str(Path(log_dir) / STREAM_FILE) if log_dir else None,
        "checkpoints": checkpoints(meta.get("output_dir")),
        "source": source,
        "meta": dict(meta),
        "params": flatten(config),
        "best": best,
        "final": dict(summary.get("last") or {}),
    }


def entry_from_run_dir(log_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Entry for a flightlog run folder (the one holding ``run.json``).

    A run that never wrote its final summary (crashed or still running) gets one
    computed from its stream, so ``best``/``final`` are there for every run.
    """
    from flightlog.runfile import read_run_file
    from flightlog.store.summarize import summarize_stream

    path = Path(log_dir)
    meta = read_run_file(path)
    if meta is None:
        raise ValueError(f"{path / RUN_FILE}: missing or not valid JSON")
    meta = dict(meta)
    actual = str(path.resolve())
    recorded = meta.get("log_dir")
    if recorded != actual:  # the folder was moved, copied or restored from an archive
        if recorded and Path(recorded).name == path.name and str(Path(recorded).parent) == meta.get("output_dir"):
            meta["output_dir"] = str(path.resolve().parent)
        meta["log_dir"] = actual
    summary = meta.get("summary")
    if not summary:
        summary = summarize_stream(Path(meta["log_dir"]))
    return entry_from_meta(meta, summary)


def entry_from_records(records: Iterable[Mapping[str, Any]], folder: str | os.PathLike[str], source: str) -> dict[str, Any] | None:
    """Entry for a run known only by its records (an importer's output for an ms-swift,
    HF or TensorBoard folder): the first ``run_start`` names it, ``run_end`` ends it,
    and last/best values are computed from the metrics. None when there are no records.

    The run id is the importer's, or one derived from the folder's path so that a
    second scan updates the same entry.
    """
    import hashlib

    from flightlog.store.summarize import summarize

    records = list(records)
    if not records:
        return None
    start = next((r for r in records if r.get("type") == "run_start"), {})
    end = next((r for r in reversed(records) if r.get("type") == "run_end"), None)
    folder = Path(folder).resolve()
    run_id = start.get("run_id") or records[0].get("run_id")
    if not isinstance(run_id, str) or not run_id:
        run_id = f"{source}-{hashlib.sha1(str(folder).encode()).hexdigest()[:12]}"
    stamps = [r["timestamp"] for r in records if isinstance(r.get("timestamp"), str)]
    summary = summarize(records)
    meta = {
        "run_id": run_id,
        "run_name": start.get("run_name") or folder.name,
        "task_type": start.get("task_type"),
        "model_name": start.get("model_name"),
        "dataset": start.get("dataset"),
        "config": start.get("config") if isinstance(start.get("config"), Mapping) else {},
        "status": (end or {}).get("status") or "unknown",
        "start_time": min(stamps) if stamps else None,
        "end_time": max(stamps) if stamps and end else None,
        "heartbeat": max(stamps) if stamps else None,
        "last_step": summary["last_step"] if isinstance(summary["last_step"], int) else None,
        "output_dir": str(folder),
        "log_dir": str(folder),
    }
    entry = entry_from_meta(meta, summary, source=source)
    entry["stream"] = None  # the records live in the other tool's files, read through the importer
    return entry
