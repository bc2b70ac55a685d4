"""The CSV sink: metrics records as a wide table (``metrics.csv`` or ``metrics.csv.gz``).

Columns are ``step, epoch, timestamp`` then every metric in first-seen order. A CSV has
one header, so when a new metric appears (the first eval, say) the file is rewritten
once with the wider header; rows already written keep their values.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from pathlib import Path
from typing import Any, TextIO

from flightlog.sinks.base import BaseSink, Record

_LEADING = ["step", "epoch", "timestamp"]
_SKIP = frozenset({"type", "run_id"})


def _open_text(path: Path, mode: str) -> TextIO:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b", compresslevel=6), encoding="utf-8", errors="backslashreplace", newline="")  # type: ignore[arg-type]
    return open(path, mode, encoding="utf-8", errors="backslashreplace", newline="")  # (a lone surrogate: escaped)


def _cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        import orjson

        return orjson.dumps(value).decode()
    return value


class CsvSink(BaseSink):
    name = "csv"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] = []
        self._known: set[str] = set()
        self._fh: TextIO | None = None
        self._writer: Any = None
        if self.path.exists() and self.path.stat().st_size > 0:
            with _open_text(self.path, "r") as fh:
                header = next(csv.reader(fh), [])
            self.columns = list(header)
            self._known = set(header)

    def _ensure_open(self) -> None:
        if self._fh is None:
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self._fh = _open_text(self.path, "a")
            self._writer = csv.writer(self._fh)
            if fresh and self.columns:
                self._writer.writerow(self.columns)

    def _widen(self, new_columns: list[str]) -> None:
        """Rewrite the file with a wider header (rare: when a new metric first appears)."""
        old_columns = self.columns
        self.columns = old_columns + new_columns
        self._known.update(new_columns)
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if not self.path.exists() or self.path.stat().st_size == 0 or not old_columns:
            if self.path.exists():
                self.path.unlink()
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with _open_text(self.path, "r") as src, _open_text(tmp, "w") as dst:
            reader = csv.reader(src)
            writer = csv.writer(dst)
            next(reader, None)
            writer.writerow(self.columns)
            pad = [""] * len(new_columns)
            for row in reader:
                writer.writerow(row + pad)
        os.replace(tmp, self.path)

    def write(self, batch: list[Record]) -> None:
        rows = [r for r in batch if r.get("type") == "metrics"]
        if not rows:
            return
        new: list[str] = []
        for record in rows:
            for key in record:
                if key not in self._known and key not in _SKIP and key not in new:
                    new.append(key)
        if new:
            if not self.columns:
                lead = [c for c in _LEADING if c in new]
                new = lead + [c for c in new if c not in lead]
            self._widen(new)
        self._ensure_open()
        columns = self.columns
        self._writer.writerows([[_cell(r.get(c, "")) for c in columns] for r in rows])

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def from_config(config: Any, run_dir: Path) -> CsvSink:
    return CsvSink(Path(run_dir) / ("metrics.csv.gz" if config.csv_compress else "metrics.csv"))
