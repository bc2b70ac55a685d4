"""TensorBoard event files, read through TensorBoard's own loader.

Scalars become metrics fields: ``train/loss`` -> ``loss``, ``eval/loss`` -> ``eval_loss``,
``train/epoch`` -> the record's epoch, other tags snake_cased (``train/memory(GiB)`` goes
through the ms-swift unit mapping). All scalars of one step form one record (eval
scalars a separate one); a step is emitted when a later step appears or when a poll
finds nothing new, so a step whose scalars straddle two polls is not split. HF writes
its ``args`` as a text summary: it becomes the run's config.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import orjson

from flightlog.store.importers.base import Importer, Record, metrics_record
from flightlog.store.importers.names import snake, swift_field

EVENT_FILE = re.compile(r"events\.out\.tfevents\.")
_SUMMARY_TAGS = frozenset({"train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second"})


def tag_fields(tag: str, value: float) -> list[tuple[str, float]]:
    """Protocol (name, value) pairs for one scalar: ``train/loss`` -> loss, ``eval/loss`` ->
    eval_loss, ``train/memory(GiB)`` -> gpu_memory_mb in MiB (the ms-swift unit mapping)."""
    head, _, rest = tag.partition("/")
    if not rest:
        head, rest = "", tag
    prefix = ""
    if head in ("eval", "val", "validation"):
        prefix = "eval_"
    elif head == "test":
        prefix = "test_"
    elif head and head != "train":
        rest = f"{head}/{rest}"
    mapped = swift_field(rest, value) or [(snake(rest), value)]
    return [(prefix + name if prefix and not name.startswith(prefix) else name, v) for name, v in mapped]


def tag_name(tag: str) -> str:
    """The protocol field name for a TensorBoard scalar tag."""
    return tag_fields(tag, 1.0)[0][0]


def event_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if EVENT_FILE.match(p.name) and p.is_file())
    except OSError:
        return []


class TensorBoardImporter(Importer):
    """Reads (and follows) the event files of one TensorBoard run directory, in name order."""

    format = "tensorboard"

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        super().__init__(path)
        self.directory = path if path.is_dir() else path.parent
        self._only = None if path.is_dir() else path
        self._loaders: dict[Path, Any] = {}
        self._pending: dict[tuple[int, str], dict[str, Any]] = {}
        self._pending_time: dict[tuple[int, str], float] = {}
        self._epoch: dict[int, float] = {}
        self._config: dict[str, Any] | None = None
        self._summary: dict[str, Any] = {}
        self._first: list[Record] = []

    def _files(self) -> list[Path]:
        return [self._only] if self._only is not None else event_files(self.directory)

    def _start(self) -> Record:
        # Read what is there first: HF's ``args`` text summary (the config) comes first.
        self._first = self._read()
        record = super()._start()
        record["run_name"] = self.directory.name
        if self._config:
            record["config"] = self._config
            for key, name in (("max_steps", "max_steps"), ("run_name", "run_name")):
                value = self._config.get(key)
                if isinstance(value, int) and value > 0 or (isinstance(value, str) and value and key == "run_name"):
                    record[name] = value
        return record

    def _loader(self, path: Path) -> Any:
        loader = self._loaders.get(path)
        if loader is None:
            try:
                from tensorboard.backend.event_processing import event_file_loader
            except ImportError:
                raise ImportError("flightlog: reading TensorBoard event files needs TensorBoard: pip install 'flightlog[tensorboard]'") from None

            # TensorBoard logs each truncated record it meets; a live file always has one.
            logging.getLogger("tensorboard").setLevel(logging.ERROR)
            loader = self._loaders[path] = event_file_loader.EventFileLoader(str(path))
        return loader

    def _poll(self) -> list[Record]:
        first, self._first = self._first, []
        return first + self._read()

    def _read(self) -> list[Record]:
        out: list[Record] = []
        new = False
        for path in self._files():
            loader = self._loader(path)  # ImportError (no TensorBoard) is the user's to see
            try:
                events = list(loader.Load())
            except Exception as exc:  # a corrupt file must not stop the others
                self.skip("unreadable event file", path.name, f"{type(exc).__name__}: {exc}"[:100])
                self._loaders[path] = _Exhausted()
                continue
            for event in events:
                new = True
                out.extend(self._event(event, path.name))
        if not new:
            out.extend(self._flush_pending(None))
        return out

    def _drain(self) -> list[Record]:
        out = self._flush_pending(None)
        if self._summary and not self.ended:
            out.append(self.run_end("finished", **self._summary))
        return out

    def _event(self, event: Any, where: str) -> list[Record]:
        if event.WhichOneof("what") != "summary":
            return []
        out: list[Record] = []
        step = int(event.step)
        # A new step closes the earlier ones (HF writes all of a log call together).
        if any(key[0] < step for key in self._pending):
            out.extend(self._flush_pending(step))
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            if plugin == "text" or value.tag.endswith("/text_summary"):
                self._text(value)
                continue
            scalar = self._scalar(value)
            if scalar is None:
                if plugin in ("", "scalars"):
                    self.drop_value(value.tag, "non-scalar", f"{where} step {step}")
                continue
            for name, number in tag_fields(value.tag, scalar):
                if name == "epoch":
                    self._epoch[step] = number
                    continue
                kind = "eval" if name.startswith(("eval_", "test_")) else "train"
                self._pending.setdefault((step, kind), {})[name] = number
                self._pending_time[(step, kind)] = float(event.wall_time)
        return out

    def _scalar(self, value: Any) -> float | None:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            return float(value.simple_value)
        if kind == "tensor":
            from tensorboard.util import tensor_util

            try:
                array = tensor_util.make_ndarray(value.tensor)
            except Exception:
                return None
            if array.size != 1 or array.dtype.kind not in "fiu":
                return None
            return float(array.reshape(()))
        return None

    def _text(self, value: Any) -> None:
        if self._config is not None or not value.tag.startswith("args"):
            return
        try:
            from tensorboard.util import tensor_util

            text = tensor_util.make_ndarray(value.tensor).reshape(-1)[0]
            data = orjson.loads(text.decode() if isinstance(text, bytes) else str(text))
        except Exception:
            return
        if isinstance(data, dict):
            self._config = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}

    def _flush_pending(self, before: int | None) -> list[Record]:
        out: list[Record] = []
        keys = sorted(k for k in self._pending if before is None or k[0] < before)
        for key in keys:
            step, kind = key
            fields = self._pending.pop(key)
            t = self._pending_time.pop(key)
            record = metrics_record(step, self._epoch.get(step), fields, t)
            out.append(record)
            if _SUMMARY_TAGS & fields.keys():
                self._summary.update({k: v for k, v in fields.items() if k in _SUMMARY_TAGS})
        if self._summary and not self.ended and before is None:
            out.append(self.run_end("finished", **self._summary))
        return out


class _Exhausted:
    """Stands in for the loader of a file that failed: yields nothing more."""

    def Load(self) -> list[Any]:
        return []
