"""ms-swift's ``logging.jsonl``: one JSON object a logging step, in ``v{N}-{timestamp}`` folders.

Two field sets exist. Both carry ``loss``, ``learning_rate``, ``grad_norm``,
``memory(GiB)``, ``epoch``, ``elapsed_time``/``remaining_time`` (``"1m 22s"``); the step
is ``global_step/max_steps`` (``"45/500"``) or, in old files, ``global_step``. The speed is
``train_speed(iter/s)``, or since 2026 ``train_speed(s/it)``. Eval lines carry ``eval_*``
fields; the end of training writes a summary line (``train_runtime``, ``train_loss``...)
and, in some versions, a run-info line (``last_model_checkpoint``, ``best_metric``...).
The folder's ``args.json`` tells the model, dataset and hyper-parameters.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import orjson

from flightlog.protocol import CHECKPOINT, RUN_START, format_timestamp
from flightlog.store.importers.base import Importer, Record, metrics_record, to_int
from flightlog.store.importers.names import swift_field
from flightlog.store.importers.tail import LineTail

VERSION_DIR = re.compile(r"^v(\d+)-(\d{8}-\d{6})$")
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"})
RUN_INFO_KEYS = frozenset({"last_model_checkpoint", "best_model_checkpoint"})
# Fields that are not metrics (envelope or text).
_NOT_METRICS = frozenset({"epoch", "global_step/max_steps", "global_step", "max_steps", "step"})
_CHECKPOINT_STEP = re.compile(r"checkpoint-(\d+)")


def loads_lenient(line: bytes) -> Any:
    """Parse one JSON line; Python's ``json`` writes NaN/Infinity bare, which strict parsers refuse."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            return json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ValueError(str(exc)) from None


def version_dirs(output_dir: Path) -> list[Path]:
    """ms-swift's ``v{N}-{YYYYMMDD-HHMMSS}`` run folders under ``output_dir``, oldest first."""
    found = []
    try:
        children = list(output_dir.iterdir())
    except OSError:
        return []
    for child in children:
        match = VERSION_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), match.group(2), child))
    return [path for _, _, path in sorted(found)]


def read_args(run_dir: Path) -> dict[str, Any]:
    """ms-swift's ``args.json`` next to ``logging.jsonl`` ({} when missing or unreadable)."""
    try:
        data = orjson.loads((run_dir / "args.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def start_fields(args: dict[str, Any]) -> dict[str, Any]:
    """run_start fields from ms-swift's arguments."""
    fields: dict[str, Any] = {}
    model = args.get("model") or args.get("model_id_or_path") or args.get("model_type")
    if isinstance(model, str):
        fields["model_name"] = model
    dataset = args.get("dataset")
    if isinstance(dataset, list):
        dataset = ",".join(str(d) for d in dataset)
    if isinstance(dataset, str) and dataset:
        fields["dataset"] = dataset
    task = args.get("rlhf_type") or args.get("task_type") or ("sft" if args else None)
    if isinstance(task, str):
        fields["task_type"] = task
    if isinstance(args.get("max_steps"), int) and args["max_steps"] > 0:
        fields["max_steps"] = args["max_steps"]
    config = {k: v for k, v in args.items() if isinstance(v, (str, int, float, bool)) or v is None}
    if config:
        fields["config"] = config
    return fields


class SwiftMapper:
    """Turns ms-swift log dicts into protocol records; shared by the file and text importers.

    Keeps the state a stream needs: the last step of each kind (to drop exact duplicates
    and to recognise a restart, which becomes a new ``run_start`` segment resumed before
    the repeated step, so loaders hide the superseded records), and ``max_steps``.
    """

    def __init__(self, importer: Importer) -> None:
        self.importer = importer
        self.max_steps: int | None = None
        self.last_step = -1
        self.last_seen: dict[str, tuple[int, dict[str, Any]]] = {}
        self.segment = 0

    def map(self, obj: dict[str, Any], where: str) -> list[Record]:
        imp = self.importer
        keys = obj.keys()
        if not keys.isdisjoint(RUN_INFO_KEYS):
            return self._run_info(obj, where)
        kind = "summary" if not keys.isdisjoint(SUMMARY_KEYS) else "eval" if any(k.startswith("eval_") for k in keys) else "train"
        step = self._step(obj, where)
        if step is None:
            if "global_step/max_steps" in obj or "global_step" in obj:
                imp.skip("unreadable step", where, f"global_step/max_steps={obj.get('global_step/max_steps', obj.get('global_step'))!r:.40}")
                return []
            if self.last_step < 0 or kind == "train":
                # Only eval and summary lines may borrow the step of the line before them.
                imp.skip("missing step", where)
                return []
            step = self.last_step
        fields: dict[str, Any] = {}
        for key, value in obj.items():
            if key in _NOT_METRICS:
                continue
            mapped = swift_field(str(key), value)
            if mapped is None:
                if value is not None:
                    imp.drop_value(str(key), value, where)
                continue
            for name, number in mapped:
                fields[name] = number
        epoch = obj.get("epoch")
        epoch = epoch if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch) else None
        out: list[Record] = []
        previous = self.last_seen.get(kind)
        if previous is not None and step <= previous[0]:
            if step == previous[0] and previous[1] == obj:
                imp.skip("duplicate record", where, f"step {step} repeated")
                return []
            if kind == "train":
                out.append(self._restart(step))
        self.last_seen[kind] = (step, obj)
        self.last_step = max(self.last_step, step) if kind != "train" else step
        if not fields:
            imp.skip("no metrics", where)
            return out
        out.append(metrics_record(step, epoch, fields))
        if kind == "summary":
            out.append(imp.run_end("finished", **{k: v for k, v in fields.items() if k.startswith(("train_", "total_"))}))
        return out

    def _step(self, obj: dict[str, Any], where: str) -> int | None:
        both = obj.get("global_step/max_steps")
        if isinstance(both, str) and "/" in both:
            left, _, right = both.partition("/")
            step, total = to_int(left), to_int(right)
            if step is None:
                return None
            if total:
                self.max_steps = total
            return step
        if both is not None:
            return None
        return to_int(obj["global_step"]) if "global_step" in obj else None

    def _restart(self, step: int) -> Record:
        self.segment += 1
        self.last_seen.clear()
        self.importer.warn(f"{self.importer.format}: step {step} comes again; recorded as a restart (segment {self.segment})")
        return {"type": RUN_START, "timestamp": format_timestamp(time.time()), "segment": self.segment, "resumed_from_step": step - 1}

    def _run_info(self, obj: dict[str, Any], where: str) -> list[Record]:
        out: list[Record] = []
        summary: dict[str, Any] = {}
        for key in ("last_model_checkpoint", "best_model_checkpoint"):
            path = obj.get(key)
            if isinstance(path, str) and path:
                match = _CHECKPOINT_STEP.search(path)
                record: Record = {"type": CHECKPOINT, "timestamp": format_timestamp(time.time()), "status": "saved", "path": path}
                if match:
                    record["step"] = int(match.group(1))
                record["best" if key.startswith("best") else "last"] = True
                out.append(record)
                summary[key] = path
        best = obj.get("best_metric")
        if isinstance(best, (int, float)) and not isinstance(best, bool):
            summary["best_metric"] = best
        if not self.importer.ended:
            out.append(self.importer.run_end("finished", **summary))
        return out


class SwiftImporter(Importer):
    """Reads (and follows) one ms-swift ``logging.jsonl``; never writes anything."""

    format = "ms-swift"

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "logging.jsonl"
        super().__init__(path)
        self.tail = LineTail(path)
        self.mapper = SwiftMapper(self)
        self.args = read_args(path.parent)

    def _start(self) -> Record:
        record = super()._start()
        record["run_name"] = self.path.parent.name
        record.update(start_fields(self.args))
        return record

    def _poll(self) -> list[Record]:
        lines = self.tail.read_lines()
        first = self.tail.line_number - len(lines) + 1
        out: list[Record] = []
        for offset, line in enumerate(lines):
            out.extend(self._line(line, first + offset))
        return out

    def _drain(self) -> list[Record]:
        partial = self.tail.take_partial()
        if not partial.strip():
            return []
        return self._line(partial, self.tail.line_number, last=True)

    def _line(self, line: bytes, number: int, last: bool = False) -> list[Record]:
        where = f"{self.path.name}:{number}"
        if not line.strip():
            return []
        try:
            obj = loads_lenient(line)
        except ValueError as exc:
            self.skip("torn last line" if last else "invalid JSON", where, str(exc)[:80])
            return []
        if not isinstance(obj, dict):
            self.skip("not a JSON object", where, type(obj).__name__)
            return []
        return self.mapper.map(obj, where)
