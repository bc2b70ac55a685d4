"""The log protocol: record types, field names, timestamps and strict-JSON encoding.

Every part of flightlog (writer, sinks, loaders, importers, server) speaks this one
format, so it lives in a module that imports nothing else from the package.
See ``docs/protocol.md`` for the full description with ``jq`` examples.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone
from itertools import repeat
from typing import Any, Final, Iterable

import orjson

SCHEMA_VERSION: Final = 1

# Record types.
RUN_START: Final = "run_start"
METRICS: Final = "metrics"
EVENT: Final = "event"
ALERT: Final = "alert"
CHECKPOINT: Final = "checkpoint"
RUN_END: Final = "run_end"
HISTOGRAMS: Final = "histograms"  # weight histograms (flightlog.sinks.histograms)
RECORD_TYPES: Final = frozenset({RUN_START, METRICS, EVENT, ALERT, CHECKPOINT, RUN_END, HISTOGRAMS})

# Fields every record carries, in the order they are written.
ENVELOPE: Final = ("type", "timestamp", "run_id", "step", "epoch")

# Seed metric names (ms-swift's vocabulary); user metrics are free snake_case names.
SEED_METRICS: Final = (
    "loss",
    "learning_rate",
    "grad_norm",
    "grad_norm_adapter",
    "grad_norm_backbone",
    "gpu_memory_mb",
    "gpu_memory_peak_mb",
    "gpu_memory_total_mb",
    "throughput_samples_per_sec",
    "throughput_tokens_per_sec",
    "step_time_s",
    "data_time_s",
    "stage",
    "precision",
)
EVAL_PREFIX: Final = "eval_"


def has_eval_metrics(keys: Iterable[Any]) -> bool:
    """Whether any key is an evaluation metric (``eval_...``); C-level over the keys."""
    return any(map(str.startswith, map(str, keys), repeat(EVAL_PREFIX)))

_LOWER_IS_BETTER = re.compile(r"(loss|perplexity|ppl|error|wer|cer|_time_s$|nll)")
_HIGHER_IS_BETTER = re.compile(r"(acc|f1|bleu|rouge|mrr|recall|precision|auc|ndcg|map_|reward|exact_match|score)")


def metric_goal(name: str) -> int:
    """-1 when smaller is better (losses), +1 when larger is better (accuracies), else 0.

    Decides which metrics get a "best" value in summaries (writer, run index, compare).
    """
    if name in ENVELOPE or "learning_rate" in name or "time" in name:
        return 0
    if _LOWER_IS_BETTER.search(name):
        return -1
    if _HIGHER_IS_BETTER.search(name):
        return 1
    return 0


LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LEVEL_NUMBERS: Final = {name: 10 * (i + 1) for i, name in enumerate(LEVELS)}

RUN_STATUSES: Final = ("running", "finished", "failed", "interrupted")
CHECKPOINT_STATUSES: Final = ("saved", "loaded", "rejected")

# File names inside a run directory.
STREAM_FILE: Final = "train.jsonl"
RUN_FILE: Final = "run.json"

# Non-finite floats are written as these strings (strict JSON has no NaN).
_NONFINITE_TO_STR: Final = {math.inf: "Infinity", -math.inf: "-Infinity"}
NONFINITE_STRINGS: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def nonfinite_to_str(value: float) -> str:
    """The protocol's string for a non-finite float."""
    return "NaN" if value != value else _NONFINITE_TO_STR[value]


_SECOND_TEXT: Final = tuple(f"{s:02d}." for s in range(60))
_MILLI_TEXT: Final = tuple(f"{ms:03d}Z" for ms in range(1000))


class _TimestampFormatter(dict):
    """ISO-8601 UTC with milliseconds, cached per millisecond (records logged in a burst
    share one string), with the text up to the second cached per second and the date and
    time up to the minute per minute (strftime costs several µs): a new millisecond costs
    one concatenation, which matters because records in training are milliseconds apart.

    The cache is the dict itself, keyed by whole milliseconds since the epoch, so the
    writer can format a whole batch with C-level ``map(format_timestamp.__getitem__, ms)``.
    """

    __slots__ = ("_minute", "_second")

    def __init__(self) -> None:
        super().__init__()
        # One attribute each: threads never see half an update.
        self._minute: tuple[int, str] = (-1, "")
        self._second: tuple[int, str] = (-1, "")

    def __call__(self, t: float) -> str:
        return self[int(t * 1000)]

    def __missing__(self, key: int) -> str:
        second, ms = divmod(key, 1000)
        cached, prefix = self._second
        if second != cached:
            minute, within = divmod(second, 60)
            cached_minute, minute_prefix = self._minute
            if minute != cached_minute:
                minute_prefix = datetime.fromtimestamp(minute * 60, timezone.utc).strftime("%Y-%m-%dT%H:%M:")
                self._minute = (minute, minute_prefix)
            prefix = minute_prefix + _SECOND_TEXT[within]
            self._second = (second, prefix)
        if len(self) >= 4096:
            self.clear()
        text = self[key] = prefix + _MILLI_TEXT[ms]
        return text


format_timestamp = _TimestampFormatter()


def now_timestamp() -> str:
    return format_timestamp(time.time())


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch from a protocol timestamp."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# Dict keys the encoder writes itself (OPT_NON_STR_KEYS); any other key (a tuple...) is
# written as its str() rather than failing the whole record.
_JSON_KEY_TYPES: Final = frozenset({str, int, float, bool, type(None)})


def clean_text(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (a file name decoded with
    ``surrogateescape``...) is written as its ``\\udcxx`` escape instead of making every
    encoder refuse the record."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _json_key(key: Any) -> Any:
    if type(key) is str:
        return clean_text(key)
    return key if type(key) in _JSON_KEY_TYPES else clean_text(str(key))


def make_finite(value: Any) -> Any:
    """Replace non-finite floats (also nested in dicts and lists) by protocol strings,
    integers beyond 64 bits (which the encoder refuses) by floats (beyond the float range:
    by the protocol's infinities), dict keys the encoder cannot write by their str(), and
    text that is not valid UTF-8 by :func:`clean_text`."""
    if type(value) is str:
        return clean_text(value)
    if type(value) is float:
        return value if value - value == 0.0 else nonfinite_to_str(value)
    if type(value) is int:
        if -(2**63) <= value < 2**64:
            return value
        try:
            return float(value)
        except OverflowError:
            return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {_json_key(k): make_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [make_finite(v) for v in value]
    return value


ENCODE_OPTIONS: Final = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


def encode(record: dict[str, Any]) -> bytes:
    """One strict-JSON line (with the newline) for a record whose values are JSON-ready.

    The caller guarantees non-finite floats were already turned into strings
    (the writer's resolve step does this in the same pass that resolves tensors).
    """
    try:
        return orjson.dumps(record, option=ENCODE_OPTIONS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits: written as a float
        return orjson.dumps(make_finite(record), option=ENCODE_OPTIONS)


def dumps(obj: Any) -> bytes:
    """Strict JSON for arbitrary protocol data, non-finite floats included."""
    return orjson.dumps(make_finite(obj), option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2)


def restore_nonfinite(record: dict[str, Any]) -> dict[str, Any]:
    """Turn the protocol's "NaN"/"Infinity"/"-Infinity" strings back into floats.

    Only top-level values are restored: those are the metric fields. Nested
    structures (config, summaries) keep their strings, as a reader of the raw file sees them.
    """
    for key, value in record.items():
        if type(value) is str and value in NONFINITE_STRINGS:
            record[key] = NONFINITE_STRINGS[value]
    return record


def decode(line: bytes | str) -> dict[str, Any]:
    """One record from one line; raises ``ValueError`` for anything that is not a JSON object."""
    obj = orjson.loads(line)
    if type(obj) is not dict:
        raise ValueError(f"a record must be a JSON object, got {type(obj).__name__}")
    return restore_nonfinite(obj)


def superseded_after(run_starts: list[dict[str, Any]]) -> dict[int, float]:
    """For each segment, the step after which its records are superseded.

    A segment that resumed from step ``r`` makes every earlier segment's records with a
    step greater than ``r`` obsolete (they were produced by a process whose progress was
    lost). A segment without ``resumed_from_step`` only appends. Returns
    ``{segment: limit}``; segments without a later resume map to ``inf``.
    """
    segments = sorted({int(r.get("segment", 0)) for r in run_starts})
    resumes = {int(r.get("segment", 0)): r.get("resumed_from_step") for r in run_starts}
    limits: dict[int, float] = {}
    floor = math.inf
    for seg in reversed(segments):
        limits[seg] = floor
        resumed = resumes.get(seg)
        if seg > 0 and resumed is not None:
            floor = min(floor, float(resumed))
    return limits
