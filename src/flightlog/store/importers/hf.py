"""HF Trainer's ``trainer_state.json``: ``log_history`` plus best checkpoint and progress.

The Trainer rewrites this file (not atomically) at every checkpoint, into
``checkpoint-N/`` and at the end into the output directory. Following it means
re-reading the newest copy when it changes and emitting only log entries not emitted
before; a copy caught half-written is retried at the next poll.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from flightlog.protocol import CHECKPOINT, format_timestamp
from flightlog.store.importers.base import Importer, Record, metrics_record, number, to_int
from flightlog.store.importers.swift import loads_lenient

STATE_FILE = "trainer_state.json"
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
_SUMMARY_KEYS = frozenset({"train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second"})
_CONFIG_KEYS = ("logging_steps", "eval_steps", "save_steps", "train_batch_size", "num_train_epochs", "max_steps")


def state_files(output_dir: Path) -> list[Path]:
    """``trainer_state.json`` copies under ``output_dir``, oldest (lowest step) first,
    the top-level one (written at the end of training) last."""
    found: list[tuple[int, Path]] = []
    try:
        children = list(output_dir.iterdir())
    except OSError:
        return []
    for child in children:
        match = _CHECKPOINT_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child / STATE_FILE))
    found.sort()
    paths = [p for _, p in found]
    if (output_dir / STATE_FILE).is_file():
        paths.append(output_dir / STATE_FILE)
    return paths


class TrainerStateImporter(Importer):
    """Reads (and follows) the newest ``trainer_state.json`` of an HF output directory."""

    format = "hf"

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self.output_dir = path if path.is_dir() else path.parent
        if not path.is_dir() and _CHECKPOINT_DIR.match(path.parent.name):
            self.output_dir = path.parent.parent
        super().__init__(path)
        self._fixed = None if path.is_dir() else path
        self._seen_version: tuple[str, int, int] | None = None
        self._emitted: set[tuple[str, int]] = set()
        self._last_step = {"train": -1, "eval": -1}
        self._state: dict[str, Any] = {}
        self._retry_logged = False
        self._best: str | None = None

    def _newest(self) -> Path | None:
        if self._fixed is not None:
            return self._fixed
        files = state_files(self.output_dir)
        if not files:
            return None
        # The newest copy is the one with the most progress; mtime breaks ties.
        return max(files, key=lambda p: (os.stat(p).st_mtime_ns if p.exists() else 0))

    def _start(self) -> Record:
        record = super()._start()
        record["run_name"] = self.output_dir.name
        state = self._read(self._newest(), quiet=True) or {}
        self._state = state
        config = {k: state[k] for k in _CONFIG_KEYS if isinstance(state.get(k), (int, float)) and not isinstance(state.get(k), bool)}
        if config:
            record["config"] = config
        max_steps = to_int(state.get("max_steps"))
        if max_steps:
            record["max_steps"] = max_steps
        return record

    def _read(self, path: Path | None, quiet: bool = False) -> dict[str, Any] | None:
        if path is None:
            return None
        try:
            data = loads_lenient(path.read_bytes())
        except OSError:
            return None
        except ValueError as exc:
            # Caught mid-rewrite (or broken): try again at the next poll.
            if not quiet and not self._retry_logged:
                self._retry_logged = True
                self.warn(f"hf importer: {path} is not valid JSON yet ({str(exc)[:60]}); will retry")
            return None
        if not isinstance(data, dict):
            self.skip("not a JSON object", str(path), type(data).__name__)
            return None
        return data

    def _poll(self) -> list[Record]:
        path = self._newest()
        if path is None:
            return []
        try:
            st = os.stat(path)
        except OSError:
            return []
        version = (str(path), st.st_mtime_ns, st.st_size)
        if version == self._seen_version:
            return []
        state = self._read(path)
        if state is None:
            return []
        self._seen_version = version
        self._state = state
        return self._entries(state, path)

    def _drain(self) -> list[Record]:
        path = self._newest()
        if path is not None and self._seen_version is None:
            state = self._read(path)
            if state is None:
                self.skip("unreadable trainer_state.json", str(path))
        return []

    def _entries(self, state: dict[str, Any], path: Path) -> list[Record]:
        history = state.get("log_history")
        if not isinstance(history, list):
            self.skip("log_history is not a list", str(path), type(history).__name__)
            return []
        out: list[Record] = []
        finished = False
        for index, entry in enumerate(history):
            where = f"{path.name} log_history[{index}]"
            if not isinstance(entry, dict):
                self.skip("log entry is not an object", where, type(entry).__name__)
                continue
            step = to_int(entry.get("step"))
            if step is None:
                self.skip("missing or bad step", where, f"step={entry.get('step')!r:.30}")
                continue
            kind = "summary" if _SUMMARY_KEYS & entry.keys() else "eval" if any(str(k).startswith("eval_") for k in entry) else "train"
            if (kind, step) in self._emitted:
                continue  # already emitted from an earlier copy, or a duplicate entry
            self._emitted.add((kind, step))
            fields: dict[str, Any] = {}
            for key, value in entry.items():
                if key in ("step", "epoch"):
                    continue
                v = number(value)
                if v is None:
                    self.drop_value(str(key), value, where)
                    continue
                fields[str(key)] = v
            epoch = entry.get("epoch")
            epoch = epoch if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch) else None
            if fields:
                out.append(metrics_record(step, epoch, fields))
            if kind == "summary":
                finished = True
        best = state.get("best_model_checkpoint")
        if isinstance(best, str) and best and best != self._best:
            self._best = best
            match = re.search(r"checkpoint-(\d+)", best)
            record: Record = {"type": CHECKPOINT, "timestamp": format_timestamp(os.stat(path).st_mtime), "status": "saved", "path": best, "best": True}
            if match:
                record["step"] = int(match.group(1))
            if isinstance(state.get("best_metric"), (int, float)):
                record["best_metric"] = state["best_metric"]
            out.append(record)
        global_step, max_steps = to_int(state.get("global_step")), to_int(state.get("max_steps"))
        if finished or (global_step is not None and max_steps and global_step >= max_steps):
            summary = {k: state[k] for k in ("global_step", "best_metric", "best_model_checkpoint") if state.get(k) is not None}
            out.append(self.run_end("finished", **summary))
        return out
