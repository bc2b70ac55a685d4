"""Text logs through templates: what training scripts print, parsed back into records.

Built-in templates, tried in this order on each line (a user regex goes first):

- events in Python logging's layout, as the seeds print them:
  ``[2024-09-12 14:22:03,187] [INFO] [sft.py:123] message``
- the seeds' console line: ``Step 45/500 | epoch 0.09 | loss 2.1423 | lr 9.98e-05 |
  grad_norm 1.234 | gpu_mem 14.2GB/24.0GB | time 1.82s/step`` (also ``Loss: 2.1``)
- printed log dicts: ms-swift's (they carry ``global_step/max_steps``) and HF Trainer's
  (``{'loss': '2.142', 'grad_norm': '1.23', 'learning_rate': '5e-05', 'epoch': '0.5'}``).

HF's printed dicts carry no step. HF prints them with ``tqdm.write`` while its progress
bar is on stderr; ``tqdm.write`` clears the bar, writes the dict and redraws the bar,
whose position at that moment is the dict's step. So the n-th dict takes the step of
the n-th redraw-after-clear of the training bar: both streams keep their own order, so
the pairing holds however the two pipes interleave. A dict with no redraw within
``pair_timeout`` seconds (no bar, e.g. ``disable_tqdm``) takes the bar's last position,
or the next ordinal step when there never was a bar.
"""

from __future__ import annotations

import ast
import re
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

from flightlog.protocol import EVENT, LEVELS, format_timestamp
from flightlog.store.importers.base import Importer, Record, metrics_record, number, to_int
from flightlog.store.importers.names import ALIASES, snake
from flightlog.store.importers.swift import SwiftMapper
from flightlog.store.importers.tail import LineTail

MAX_LINE = 100_000  # longer lines are not log lines; never hand them to the parsers

EVENT_LINE = re.compile(
    r"^\[(?P<time>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d{1,6})?)\]\s*\[(?P<level>[A-Z]+)\]\s*\[(?P<source>[^\]]*)\]\s?(?P<message>.*)$"
)
STEP_LINE = re.compile(r"^\s*\[?\s*Step\s+(?P<step>\d+)(?:\s*/\s*(?P<max>\d+))?\s*\]?\s*(?:[|:,]\s*)?(?P<rest>.*)$", re.IGNORECASE)
STEP_PART = re.compile(
    r"^\s*(?P<key>[A-Za-z_][\w.()/-]*(?:\s[A-Za-z_][\w()-]*)?)\s*[:=]?\s+"
    r"(?P<value>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|NaN|Infinity))"
    r"(?P<unit>[A-Za-z/%]*)(?:\s*/\s*(?P<total>[-+]?\d+\.?\d*)(?P<total_unit>[A-Za-z]*))?\s*$"
)
PART_SPLIT = re.compile(r"\s*\|\s*|,\s+")
DICT_LINE = re.compile(r"^(?P<prefix>[^{]*?)(?P<dict>\{.*\})\s*$")
PREFIX_STEP = re.compile(r"\bStep\s+(\d+)", re.IGNORECASE)
WRAPPED_NUMBER = re.compile(
    r"(?:\b[A-Za-z_][\w]*\.)*(?:float\d*|int\d*|tensor|bfloat16|half)\(\s*"
    r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))\s*(?:,[^()]*)?\)"
)
BARE_NONFINITE = re.compile(r"(?<=[:\s])(-?inf|nan)(?=\s*[,}])")
TQDM_BAR = re.compile(r"\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[")
_SEPARATORS = re.compile(rb"[\r\n]")
UNIT_SCALE = {"gb": 1024.0, "gib": 1024.0, "mb": 1.0, "mib": 1.0, "kb": 1 / 1024, "tb": 1024.0 * 1024}
SWIFT_KEYS = frozenset({"global_step/max_steps", "memory(GiB)", "global_step", "train_speed(iter/s)", "train_speed(s/it)"})
HF_SUMMARY = frozenset({"train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second"})


def _local_timestamp(text: str) -> str:
    try:
        moment = datetime.fromisoformat(text.replace(",", ".").replace(" ", "T"))
    except ValueError:
        return format_timestamp(time.time())
    return format_timestamp(moment.timestamp())


def parse_dict(text: str) -> dict[str, Any] | None:
    """A printed Python dict (numpy/torch scalars and bare nan/inf allowed) or None."""
    if len(text) > MAX_LINE:
        return None
    cleaned = WRAPPED_NUMBER.sub(r"\1", text)
    cleaned = BARE_NONFINITE.sub(r"'\1'", cleaned)
    try:
        value = ast.literal_eval(cleaned)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class RegexTemplate:
    """A user template: a regex with named groups (``step``, ``epoch``, metrics; or
    ``message`` with optional ``level``/``source`` for events)."""

    def __init__(self, pattern: str) -> None:
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"flightlog: text template {pattern!r} is not a valid regular expression: {exc}") from None
        groups = set(self.regex.groupindex)
        if not groups:
            raise ValueError(f"flightlog: text template {pattern!r} has no named groups; use (?P<step>\\d+), (?P<loss>\\S+), ...")
        if "step" not in groups and "message" not in groups:
            raise ValueError(f"flightlog: text template {pattern!r} needs a (?P<step>...) group for metrics or a (?P<message>...) group for events")
        self.pattern = pattern


class ConsoleParser:
    """Turns console output (line by line, ``\\r``-separated segments too) into records."""

    def __init__(self, importer: Importer, templates: Iterable[RegexTemplate] = (), pair_timeout: float = 1.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.importer = importer
        self.templates = list(templates)
        self.swift = SwiftMapper(importer)
        self.pair_timeout = pair_timeout
        self.clock = clock
        self.max_steps: int | None = None
        self.last_step = 0
        self.bar_total: int | None = None
        self.bar_n: int | None = None
        self._armed = False
        self._redraws: deque[tuple[float, int]] = deque(maxlen=10_000)
        self._waiting: deque[tuple[float, dict[str, Any], str]] = deque()
        self._max_from_bar = False
        self._last_paired = -1
        self._last_train = -1
        self._ratio: float | None = None  # steps per epoch, from the latest paired dict
        self._ratio_step = 0
        self.redraws_skipped = 0

    # ------------------------------------------------------------------ input
    def feed(self, line: str, where: str) -> list[Record]:
        """Records from one line (which may hold ``\\r``-separated progress-bar segments)."""
        out: list[Record] = []
        for segment in line.split("\r"):
            out.extend(self._segment(segment, where))
        out.extend(self.tick())
        return out

    def tick(self) -> list[Record]:
        """Pair waiting HF dicts with bar redraws; give up waiting after ``pair_timeout``."""
        out: list[Record] = []
        now = self.clock()
        while self._waiting and self._redraws:
            arrived, obj, where = self._waiting[0]
            drawn, n = self._redraws.popleft()
            if drawn < arrived - self.pair_timeout or not self._plausible(obj, n):
                # A redraw after some other clear (a finished nested bar, another write):
                # long before this dict, or a step this dict cannot have. Not its partner.
                self.redraws_skipped += 1
                continue
            self._waiting.popleft()
            out.extend(self._paired(obj, n, where))
        while self._waiting and now - self._waiting[0][0] >= self.pair_timeout:
            _, obj, where = self._waiting.popleft()
            self._ratio, self._ratio_step = None, 0  # unsure from here on: calibrate the epoch check again
            out.extend(self._hf(obj, None, where))
        return out

    def _plausible(self, obj: dict[str, Any], n: int) -> bool:
        """Could ``n`` be this dict's step? A train log comes after the previous train log's
        step (eval and summary logs may share it), and HF's epoch grows in proportion to
        the step, so once a pair calibrated that ratio, the epoch predicts the step to
        within its 4 printed digits."""
        train = not any(str(k).startswith("eval_") for k in obj) and not HF_SUMMARY & obj.keys()
        if n < self._last_paired or (train and n <= self._last_train):
            return False
        epoch = number(obj.get("epoch"))
        if self._ratio and isinstance(epoch, float) and epoch > 0:
            expected = epoch * self._ratio
            return abs(n - expected) <= 0.5 + 1.5e-3 * expected
        return True

    def _paired(self, obj: dict[str, Any], n: int, where: str) -> list[Record]:
        self._last_paired = n
        if not any(str(k).startswith("eval_") for k in obj) and not HF_SUMMARY & obj.keys():
            self._last_train = n
        epoch = number(obj.get("epoch"))
        if isinstance(epoch, float) and epoch > 0 and n > 0 and n >= self._ratio_step:
            self._ratio, self._ratio_step = n / epoch, n
        return self._hf(obj, n, where)

    def finish(self) -> list[Record]:
        """The input ended: pair what still waits with what redraws are left."""
        out = self.tick()
        while self._waiting:
            _, obj, where = self._waiting.popleft()
            n = None
            while self._redraws:
                candidate = self._redraws.popleft()[1]
                if self._plausible(obj, candidate):
                    n = candidate
                    break
                self.redraws_skipped += 1
            out.extend(self._paired(obj, n, where) if n is not None else self._hf(obj, None, where))
        return out

    # ------------------------------------------------------------------ parsing
    def _segment(self, segment: str, where: str) -> list[Record]:
        if len(segment) > MAX_LINE:
            self.importer.skip("line too long", where, f"{len(segment)} characters")
            return []
        if not segment.strip():
            if segment:
                self._armed = True  # tqdm cleared its bar: the next draw is a redraw after a write
            return []
        for template in self.templates:
            match = template.regex.search(segment)
            if match:
                return self._user(match, where)
        bar = TQDM_BAR.search(segment)
        if bar and "{" not in segment:
            self._bar(int(bar.group("n")), int(bar.group("total")))
            return []
        match = EVENT_LINE.match(segment.strip())
        if match:
            level = match.group("level")
            return [{
                "type": EVENT,
                "timestamp": _local_timestamp(match.group("time")),
                "level": level if level in LEVELS else "INFO",
                "source": match.group("source"),
                "message": match.group("message"),
            }]
        match = STEP_LINE.match(segment)
        if match and match.group("rest") and not match.group("rest").lstrip().startswith("{"):
            return self._step_line(match, where)
        match = DICT_LINE.match(segment.strip())
        if match:
            obj = parse_dict(match.group("dict"))
            if obj is not None:
                return self._dict(obj, match.group("prefix"), where)
        return []

    def _bar(self, n: int, total: int) -> None:
        finished = self.bar_n is not None and self.bar_total is not None and self.bar_n >= self.bar_total
        if self.bar_total is None or (total != self.bar_total and finished):
            # The training bar is the first bar, or the first after a finished one
            # (a dataset ``map`` bar often comes before training starts).
            self.bar_total, self.bar_n = total, None
            if self.max_steps is None or self._max_from_bar:
                self.max_steps, self._max_from_bar = total, True
        if total != self.bar_total:
            return  # an evaluation bar
        self.bar_n = n
        if self._armed:
            self._armed = False
            self._redraws.append((self.clock(), n))

    def _step_line(self, match: re.Match[str], where: str) -> list[Record]:
        step = int(match.group("step"))
        if match.group("max"):
            self.max_steps, self._max_from_bar = int(match.group("max")), False
        fields: dict[str, Any] = {}
        epoch = None
        for part in PART_SPLIT.split(match.group("rest")):
            if not part:
                continue
            # Fast path: "name value" with a plain number.
            name, _, text = part.strip().rpartition(" ")
            if name and " " not in name:
                try:
                    value = float(text)
                except ValueError:
                    pass
                else:
                    key = snake(name)
                    if key == "epoch":
                        epoch = value
                    else:
                        fields[ALIASES.get(key) or key] = value
                    continue
            pm = STEP_PART.match(part)
            if not pm:
                continue
            key = snake(pm.group("key"))
            value = number(pm.group("value"))
            unit = pm.group("unit").lower()
            if value is None:
                self.importer.drop_value(key, pm.group("value"), where)
                continue
            if key == "epoch":
                epoch = value
                continue
            if key in ("time", "step_time") and unit.startswith("s"):
                fields["step_time_s"] = value
                continue
            if unit in UNIT_SCALE and key in ("gpu_mem", "gpu_memory", "memory", "mem"):
                fields["gpu_memory_mb"] = value * UNIT_SCALE[unit]
                total = number(pm.group("total") or "")
                if total is not None:
                    fields["gpu_memory_total_mb"] = total * UNIT_SCALE.get((pm.group("total_unit") or unit).lower(), 1.0)
                continue
            fields[ALIASES.get(key, key)] = value
        if not fields:
            return []
        self.last_step = step
        return [metrics_record(step, epoch, fields)]

    def _dict(self, obj: dict[str, Any], prefix: str, where: str) -> list[Record]:
        if SWIFT_KEYS & obj.keys():
            records = self.swift.map(obj, where)
            if self.swift.max_steps:
                self.max_steps, self._max_from_bar = self.swift.max_steps, False
            for r in records:
                if isinstance(r.get("step"), int):
                    self.last_step = r["step"]
            return records
        if not any(isinstance(number(v), (int, float)) for v in obj.values()):
            return []  # a dict that is not a log (a config printout)
        step_match = PREFIX_STEP.search(prefix)
        if step_match:
            return self._hf(obj, int(step_match.group(1)), where)
        self._waiting.append((self.clock(), obj, where))
        return self.tick()

    def _hf(self, obj: dict[str, Any], step: int | None, where: str) -> list[Record]:
        if step is None:
            step = self.bar_n if self.bar_n is not None else self.last_step + 1
        self.last_step = step
        fields: dict[str, Any] = {}
        for key, value in obj.items():
            if key in ("epoch", "step"):
                continue
            v = number(value)
            if v is None:
                self.importer.drop_value(str(key), value, where)
                continue
            fields[snake(str(key))] = v
        epoch = number(obj.get("epoch"))
        if not fields:
            return []
        out = [metrics_record(step, epoch, fields)]
        if HF_SUMMARY & fields.keys() and not self.importer.ended:
            out.append(self.importer.run_end("finished", **{k: v for k, v in fields.items() if k in HF_SUMMARY}))
        return out

    def _user(self, match: re.Match[str], where: str) -> list[Record]:
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        if "message" in groups:
            level = groups.get("level", "INFO").upper()
            record: Record = {
                "type": EVENT,
                "timestamp": _local_timestamp(groups["time"]) if "time" in groups else format_timestamp(time.time()),
                "level": level if level in LEVELS else "INFO",
                "source": groups.get("source", "text"),
                "message": groups["message"],
            }
            return [record]
        step = to_int(groups.pop("step", None))
        if step is None:
            self.importer.skip("unreadable step", where, f"step={match.group('step')!r:.30}")
            return []
        epoch = number(groups.pop("epoch", None))
        fields: dict[str, Any] = {}
        for key, value in groups.items():
            v = number(value)
            if v is None:
                self.importer.drop_value(key, value, where)
                continue
            fields[ALIASES.get(key, key)] = v
        self.last_step = step
        return [metrics_record(step, epoch, fields)] if fields else []


class SegmentSplitter:
    """Cuts a stream's bytes into ``\\r``/``\\n``-terminated segments with their line numbers.

    The unterminated rest is held for the next call. A held rest that already is a
    whole tqdm bar is handed out at once: tqdm ends a redraw with no separator until its
    next redraw, which may be a slow step away, and the redraw right after a printed
    dict is what gives the dict its step.
    """

    def __init__(self) -> None:
        self.tail = b""
        self.tail_sent = False
        self.line = 1

    def feed(self, data: bytes) -> list[tuple[str, int]]:
        data = self.tail + data
        out: list[tuple[str, int]] = []
        start = 0
        for match in _SEPARATORS.finditer(data):
            text = data[start:match.start()].decode("utf-8", "replace")
            if self.tail_sent:
                text = ""  # the first segment is the bar already handed out
                self.tail_sent = False
            out.append((text, self.line))
            if match.group() == b"\n":
                self.line += 1
            start = match.end()
        self.tail = data[start:]
        if self.tail and not self.tail_sent:
            text = self.tail.decode("utf-8", "replace")
            if TQDM_BAR.search(text) and text.rstrip().endswith("]"):
                out.append((text, self.line))
                self.tail_sent = True
        return out

    def close(self) -> bytes:
        """The held unterminated rest (empty if it was a bar already handed out)."""
        tail, self.tail = self.tail, b""
        sent, self.tail_sent = self.tail_sent, False
        return b"" if sent else tail


class TextImporter(Importer):
    """Reads (and follows) a text log file through the templates; read-only."""

    format = "text"

    def __init__(self, path: str | Path, patterns: Iterable[str] = (), pair_timeout: float = 1.5) -> None:
        super().__init__(path)
        self.tail = LineTail(self.path)
        self.parser = ConsoleParser(self, [RegexTemplate(p) for p in patterns], pair_timeout=pair_timeout)
        self.splitter = SegmentSplitter()
        self._resets = 0

    def _start(self) -> Record:
        record = super()._start()
        record["run_name"] = self.path.parent.name
        return record

    def _poll(self) -> list[Record]:
        data = self.tail.read_bytes()
        if self.tail.resets != self._resets:  # truncated or rotated: start over
            self._resets = self.tail.resets
            self.splitter = SegmentSplitter()
        out: list[Record] = []
        for segment, line in self.splitter.feed(data) if data else []:
            out.extend(self.parser.feed(segment, f"{self.path.name}:{line}"))
        out.extend(self.parser.tick())
        return out

    def _drain(self) -> list[Record]:
        # A last line without its newline may be cut anywhere (``loss 2.1`` of ``loss 2.1423``):
        # parsing it could record a wrong value, so it is counted and skipped.
        rest = self.splitter.close()
        if rest.strip():
            self.skip("incomplete last line", f"{self.path.name}:{self.splitter.line}", f"{len(rest)} bytes without a newline")
        return self.parser.finish()
