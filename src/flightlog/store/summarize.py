"""Last and best metric values computed from a stream, for runs that never wrote them.

A run that finished has its summary in ``run.json``; a crashed run, a running run
seen by ``flightlog index``, or an imported log has only its records. This gives the
same shape as the writer's summary (``last_step``, ``last``, ``best``), ignoring
records that a resume superseded. The better-direction of a metric follows the
writer's rule (``pipeline.summary.metric_goal``; the store may not import the
pipeline, and a test keeps the two in agreement).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from flightlog.protocol import METRICS, RUN_START, STREAM_FILE, decode, superseded_after

_LOWER_IS_BETTER = re.compile(r"(loss|perplexity|ppl|error|wer|cer|_time_s$|nll)")
_HIGHER_IS_BETTER = re.compile(r"(acc|f1|bleu|rouge|mrr|recall|precision|auc|ndcg|map_|reward|exact_match|score)")
_ENVELOPE = frozenset({"type", "timestamp", "run_id", "step", "epoch"})


def metric_goal(name: str) -> int:
    """-1 when smaller is better (losses), +1 when larger is better (accuracies), else 0."""
    if name in _ENVELOPE or "learning_rate" in name or "time" in name:
        return 0
    if _LOWER_IS_BETTER.search(name):
        return -1
    if _HIGHER_IS_BETTER.search(name):
        return 1
    return 0


def stream_files(log_dir: Path) -> list[Path]:
    """The stream's files in write order: gzip segments (``train*.jsonl.gz``), then ``train.jsonl``."""
    segments = sorted(log_dir.glob("train*.jsonl.gz"))
    live = log_dir / STREAM_FILE
    return segments + ([live] if live.exists() else [])


def iter_stream(log_dir: Path) -> Iterator[dict[str, Any]]:
    """Every readable record of a run's stream; torn or foreign lines are skipped."""
    for path in stream_files(log_dir):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rb") as fh:
                for line in fh:
                    if not line.endswith(b"\n"):
                        break  # a torn last line: the writer has not finished it yet
                    try:
                        yield decode(line)
                    except ValueError:
                        continue
        except (OSError, EOFError):
            continue


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``{"last_step", "metrics_records", "last", "best"}`` over non-superseded metrics."""
    starts: list[dict[str, Any]] = []
    kept: list[tuple[int, dict[str, Any]]] = []
    segment = 0
    for record in records:
        kind = record.get("type")
        if kind == RUN_START:
            starts.append(record)
            segment = int(record.get("segment") or 0)
        elif kind == METRICS:
            kept.append((segment, record))
    limits = superseded_after(starts) if starts else {}
    last: dict[str, Any] = {}
    best: dict[str, dict[str, Any]] = {}
    goals: dict[str, int] = {}
    last_step = None
    count = 0
    for segment, record in kept:
        step = record.get("step")
        if isinstance(step, (int, float)) and step > limits.get(segment, float("inf")):
            continue
        count += 1
        if step is not None:
            last_step = step
        for key, value in record.items():
            if key in _ENVELOPE:
                continue
            last[key] = value
            goal = goals.get(key)
            if goal is None:
                goal = goals[key] = metric_goal(key)
            if goal and type(value) in (int, float) and value == value:
                old = best.get(key)
                if old is None or (value < old["value"] if goal < 0 else value > old["value"]):
                    best[key] = {"value": value, "step": step}
    return {"last_step": last_step, "metrics_records": count, "last": last, "best": best}


def summarize_stream(log_dir: Path) -> dict[str, Any]:
    return summarize(iter_stream(log_dir))
