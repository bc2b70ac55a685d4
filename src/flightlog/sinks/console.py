"""The console sink: the seeds' human format, one line a record.

Metrics::

    Step 45/500 | epoch 0.09 | loss 2.1423 | lr 9.98e-05 | grad_norm 1.234 | gpu_mem 14.2GB/24.0GB | time 1.82s/step

Events (and alerts, checkpoints), in Python logging's layout, local time::

    [2024-09-12 14:22:03,187] [INFO] [sft.py:123] message

The line format is stable so that ``grep``/``awk`` recipes (and flightlog's own text
importer) keep working.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any, TextIO

from flightlog.protocol import LEVEL_NUMBERS, parse_timestamp
from flightlog.sinks.base import BaseSink, Record

# Envelope fields never shown as metrics.
_HIDDEN = frozenset({
    "type", "timestamp", "run_id", "step", "epoch", "gpu_memory_mb", "gpu_memory_total_mb", "learning_rate",
    "step_time_s", "segment", "rank",
    # Recorded in the stream, too detailed for the one-line view.
    "data_time_s", "throughput_samples_per_sec", "throughput_tokens_per_sec", "stage", "precision",
    "gpu_memory_peak_mb",
})
# The seeds' fixed order after epoch; everything else follows in record order.
_LEADING = ("loss", "learning_rate", "grad_norm")


def format_number(value: Any) -> str:
    if type(value) is bool or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-3 or magnitude >= 1e6):
        return f"{value:.2e}"
    return f"{value:.4g}"


def format_metrics(record: Record, max_steps: int | None = None) -> str:
    parts: list[str] = []
    step = record.get("step")
    if step is not None:
        parts.append(f"Step {step}/{max_steps}" if max_steps else f"Step {step}")
    epoch = record.get("epoch")
    if isinstance(epoch, (int, float)):
        parts.append(f"epoch {epoch:.2f}")
    if "loss" in record:
        loss = record["loss"]
        parts.append(f"loss {loss:.4f}" if isinstance(loss, float) and loss == loss and abs(loss) != float("inf") else f"loss {loss}")
    if "learning_rate" in record:
        lr = record["learning_rate"]
        parts.append(f"lr {lr:.2e}" if isinstance(lr, (int, float)) else f"lr {lr}")
    if "grad_norm" in record:
        parts.append(f"grad_norm {format_number(record['grad_norm'])}")
    mem, total = record.get("gpu_memory_mb"), record.get("gpu_memory_total_mb")
    if isinstance(mem, (int, float)):
        parts.append(f"gpu_mem {mem / 1024:.1f}GB/{total / 1024:.1f}GB" if isinstance(total, (int, float)) else f"gpu_mem {mem / 1024:.1f}GB")
    step_time = record.get("step_time_s")
    if isinstance(step_time, (int, float)):
        parts.append(f"time {step_time:.2f}s/step" if step_time >= 0.1 else f"time {step_time:.3f}s/step")
    for key, value in record.items():
        if key in _HIDDEN or key in _LEADING or key in ("grad_norm",):
            continue
        if isinstance(value, (dict, list)):
            continue
        parts.append(f"{key} {format_number(value)}")
    return " | ".join(parts)


def format_local_time(timestamp: str) -> str:
    try:
        moment = datetime.fromtimestamp(parse_timestamp(timestamp))
    except (ValueError, TypeError):
        return str(timestamp)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + f",{moment.microsecond // 1000:03d}"


def format_line(level: str, source: str, message: str, timestamp: str) -> str:
    return f"[{format_local_time(timestamp)}] [{level}] [{source}] {message}"


def format_record(record: Record, max_steps: int | None = None) -> str | None:
    kind = record.get("type")
    ts = record.get("timestamp", "")
    if kind == "metrics":
        return format_metrics(record, max_steps)
    if kind == "event":
        return format_line(record.get("level", "INFO"), record.get("source", "?"), str(record.get("message", "")), ts)
    if kind == "alert":
        detail = []
        if "value" in record:
            detail.append(f"value={format_number(record['value'])}")
        if "threshold" in record:
            detail.append(f"threshold={format_number(record['threshold'])}")
        tail = f" ({', '.join(detail)})" if detail else ""
        action = f" -> {record['action']}" if record.get("action") else ""
        severity = str(record.get("severity", "warning"))
        level = {"critical": "CRITICAL", "error": "ERROR", "info": "INFO"}.get(severity, "WARNING")
        return format_line(level, "flightlog/rules", f"ALERT {record.get('rule', '?')}: {record.get('message', '')}{tail}{action}", ts)
    if kind == "checkpoint":
        size = record.get("bytes")
        size_text = f", {size / 1e6:.1f} MB" if isinstance(size, (int, float)) else ""
        secs = record.get("seconds")
        secs_text = f", {secs:.2f}s" if isinstance(secs, (int, float)) else ""
        return format_line("INFO", "flightlog/checkpoint", f"checkpoint {record.get('status', '?')}: {record.get('path', '')}{size_text}{secs_text}", ts)
    if kind == "run_start":
        resumed = record.get("resumed_from_step")
        how = f"resumed from step {resumed}" if resumed is not None else "started"
        return format_line(
            "INFO", "flightlog", f"run {record.get('run_name')!s} ({record.get('run_id')}) {how}; logs in {record.get('log_dir', '?')}", ts
        )
    if kind == "run_end":
        return format_line("INFO", "flightlog", f"run {record.get('run_id')} {record.get('status', 'ended')}", ts)
    return None


class ConsoleSink(BaseSink):
    name = "console"

    def __init__(self, stream: TextIO | None = None, *, max_steps: int | None = None, level: str = "INFO") -> None:
        self._stream = stream
        self.max_steps = max_steps
        self.level_number = LEVEL_NUMBERS.get(level, 20)

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def write(self, batch: list[Record]) -> None:
        lines = []
        for record in batch:
            if record.get("type") == "event" and LEVEL_NUMBERS.get(record.get("level", "INFO"), 20) < self.level_number:
                continue
            if record.get("type") == "run_start" and record.get("max_steps"):
                self.max_steps = record["max_steps"]
            line = format_record(record, self.max_steps)
            if line is not None:
                lines.append(line)
        if lines:
            text = "\n".join(lines) + "\n"
            try:
                self.stream.write(text)
            except UnicodeEncodeError:  # a lone surrogate, or a stream that is not UTF-8
                encoding = getattr(self.stream, "encoding", None) or "utf-8"
                self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding))

    def flush(self) -> None:
        self.stream.flush()


def from_config(config: Any, run_dir: Any) -> ConsoleSink:
    stream = sys.stderr if config.console_stream == "stderr" else None
    return ConsoleSink(stream, max_steps=config.max_steps, level=config.log_level)
