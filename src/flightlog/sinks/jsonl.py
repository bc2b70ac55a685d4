"""The JSONL sink: the run's record stream, the one file nothing may tear.

Plain mode appends to ``train.jsonl`` with unbuffered ``os.write`` calls of whole
lines. If a write fails (a full disk, ENOSPC), the file is truncated back to the last
complete line and the unwritten bytes are kept and retried on the next write, so an
accepted record is never lost while the disk recovers and no torn line is left in the
middle of the file.

Compressed mode writes gzip segments ``train.NNNNN.jsonl.gz``, rotated by size. Each
flush ends with a zlib sync-flush, so a reader can decompress everything flushed so far
while the run is still live.

Plain mode also keeps a columnar copy (``train.cols/``, :mod:`flightlog.sinks.columnar`,
config ``columnar``) so that loading a big run needs no JSON parsing.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path
from typing import Any

import orjson

from flightlog.protocol import STREAM_FILE, encode
from flightlog.sinks.base import BaseSink, Record

MAX_PENDING_BYTES = 512 * 1024 * 1024  # what is kept for retry while the disk is full
SEGMENT_PATTERN = re.compile(r"^train\.(\d{5})\.jsonl\.gz$")


def segment_name(index: int) -> str:
    return f"train.{index:05d}.jsonl.gz"


def next_segment_index(directory: Path) -> int:
    indexes = [int(m.group(1)) for p in directory.glob("train.*.jsonl.gz") if (m := SEGMENT_PATTERN.match(p.name))]
    return max(indexes) + 1 if indexes else 0


class JsonlSink(BaseSink):
    name = "jsonl"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: str = "finish",
        compress: bool = False,
        segment_bytes: int = 64 * 1024 * 1024,
        filename: str = STREAM_FILE,
        columnar: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync_policy = fsync
        self.compress = compress
        self.segment_bytes = segment_bytes
        self.filename = filename
        self._pending = bytearray()  # encoded lines not yet on disk
        self.dropped_bytes = 0
        self._fd = -1
        self._good_offset = 0
        self._compressor: Any = None
        self._segment = 0
        self._segment_bytes_written = 0
        self._dirty = False
        self._open()
        self._sidecar: Any = None
        if columnar and not compress and filename == STREAM_FILE:
            from flightlog.sinks.columnar import ColumnarSidecar

            self._sidecar = ColumnarSidecar(self.directory, self._good_offset + len(self._pending))

    # ------------------------------------------------------------------ files
    @property
    def path(self) -> Path:
        if self.compress:
            return self.directory / segment_name(self._segment)
        return self.directory / self.filename

    def _open(self) -> None:
        if self.compress:
            self._segment = next_segment_index(self.directory)
            self._compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
            self._segment_bytes_written = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._good_offset = os.fstat(self._fd).st_size
        if not self.compress and self._good_offset > 0:
            self._repair_tail()

    def _repair_tail(self) -> None:
        """A previous process may have died mid-line: end that line so ours start clean."""
        with open(self.path, "rb") as fh:
            fh.seek(self._good_offset - 1)
            if fh.read(1) != b"\n":
                self._pending += b"\n"

    def _rotate(self) -> None:
        self._finish_segment()
        os.close(self._fd)
        self._open()

    def _finish_segment(self) -> None:
        if self._compressor is not None:
            self._pending += self._compressor.flush(zlib.Z_FINISH)
            self._compressor = None
            self._write_pending()

    # ------------------------------------------------------------------ sink API
    def write(self, batch: list[Record]) -> None:
        if not batch:
            return
        lines: list[bytes] | None = None
        try:
            # Option-free calls straight from map(): the cheapest encoding per record.
            data = b"\n".join(map(orjson.dumps, batch)) + b"\n"
        except orjson.JSONEncodeError:  # a key that is not a string, an integer beyond 64 bits
            lines = [encode(r) for r in batch]
            data = b"".join(lines)
        if self.compress:
            data = self._compressor.compress(data)
        self._pending += data
        self._dirty = True
        self._write_pending()
        if self._sidecar is not None:
            try:
                self._sidecar.add(batch, data.splitlines(keepends=True) if lines is None else lines, data, self._good_offset)
            except Exception:  # the stream is written; a sidecar problem must not fail it
                self._sidecar.broken = True
        if self.compress and self._segment_bytes_written >= self.segment_bytes:
            self._pending += self._compressor.flush(zlib.Z_SYNC_FLUSH)
            self._rotate()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        view = memoryview(self._pending)
        written = 0
        try:
            while written < len(view):
                n = os.write(self._fd, view[written:])
                written += n
                self._good_offset += n
        except OSError:
            self._rollback(written)
            raise
        finally:
            view.release()
            self._segment_bytes_written += written
        self._pending.clear()

    def _rollback(self, written: int) -> None:
        """Undo a partial write so the file ends at a whole line; keep the bytes for retry."""
        if not self.compress and written:
            self._good_offset -= written
            try:
                os.ftruncate(self._fd, self._good_offset)
            except OSError:
                # Cannot cut the torn part off (e.g. a device file): keep the rest for
                # after a newline so the torn line stays a single skippable line.
                del self._pending[:written]
                self._pending[:0] = b"\n"
                written = 0
            else:
                written = 0
        del self._pending[:written]
        if len(self._pending) > MAX_PENDING_BYTES:
            cut = len(self._pending) - MAX_PENDING_BYTES
            cut = self._pending.find(b"\n", cut) + 1 if not self.compress else cut
            self.dropped_bytes += cut
            del self._pending[:cut]

    def flush(self) -> None:
        if self.compress and self._compressor is not None and self._dirty:
            self._pending += self._compressor.flush(zlib.Z_SYNC_FLUSH)
        self._write_pending()
        if self._dirty and self.fsync_policy == "flush":
            os.fsync(self._fd)
        self._dirty = False

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self._finish_segment()
            self._write_pending()
            if self.fsync_policy in ("flush", "finish"):
                os.fsync(self._fd)
            if self._sidecar is not None:  # after the fsync: the stream is durable first
                if self._pending:
                    self._sidecar.broken = True  # the stream is short of what it was given
                try:
                    self._sidecar.close()
                except Exception:
                    pass
        finally:
            os.close(self._fd)
            self._fd = -1


def from_config(config: Any, run_dir: Path) -> JsonlSink:
    return JsonlSink(
        run_dir, fsync=config.fsync, compress=config.compress, segment_bytes=config.segment_bytes, columnar=getattr(config, "columnar", True)
    )
