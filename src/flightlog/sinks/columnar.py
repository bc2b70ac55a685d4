"""A columnar copy of ``train.jsonl``, written by the writer thread, so that loading a
run never has to parse gigabytes of JSON (``flightlog.load`` reads this copy, cold).

The JSONL stream stays the record of truth. After the JSONL sink has written a batch it
hands the records and the file offset they end at to :class:`ColumnarSidecar`, which
keeps them in memory and, every ``CHUNK_RECORDS`` records (and when a run that wrote
chunks closes), writes one Arrow IPC file per record type to ``logs/train.cols/`` and then appends one
line to ``train.cols/chunks.jsonl`` naming the byte range ``[start, end)`` of
``train.jsonl`` that the chunk holds (with hashes of the bytes at both ends, so a
rewritten stream is never served stale). A loader uses the chunks that match the file
and parses the JSONL for the rest (the tail since the last chunk, a crashed process's
unflushed records), see :mod:`flightlog.store.fastload`.

Anything that goes wrong here (no polars, a value Polars cannot hold, a full disk)
switches the sidecar off for the rest of the process and never reaches the JSONL sink:
the loader then simply parses more JSON.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

SIDECAR_DIR = "train.cols"
MANIFEST = "chunks.jsonl"
CHUNK_RECORDS = 65_536
EDGE_BYTES = 64  # bytes hashed at each end of a chunk's byte range
FORMAT = 1
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S%.3fZ"


def edge_hash(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


class ColumnarSidecar:
    """Buffers what the JSONL sink wrote and writes it as Arrow chunks (writer thread only)."""

    def __init__(self, directory: str | os.PathLike[str], start_offset: int, chunk_records: int | None = None) -> None:
        self.folder = Path(directory) / SIDECAR_DIR
        self.chunk_records = chunk_records or CHUNK_RECORDS
        self.start = start_offset  # where the buffered records begin in train.jsonl
        self.end = start_offset
        self.head = b""  # first bytes of the buffered range
        self.tail = b""  # last bytes of the buffered range
        self.records: list[dict[str, Any]] = []
        self.segment: int | None = None  # None until this process's run_start is seen
        self.broken = False
        self.chunks_written = 0

    def add(self, batch: list[dict[str, Any]], data: bytes, end_offset: int) -> None:
        """``batch`` was written as ``data``, which ends at ``end_offset`` of the stream."""
        if self.broken:
            return
        if end_offset - len(data) != self.end:  # bytes we did not see (a retry after ENOSPC)
            self.broken = True
            return
        if not self.records:
            self.head = data[:EDGE_BYTES]
        elif len(self.head) < EDGE_BYTES:
            self.head = (self.head + data)[:EDGE_BYTES]
        self.tail = (self.tail + data)[-EDGE_BYTES:] if len(data) < EDGE_BYTES else data[-EDGE_BYTES:]
        self.records.extend(batch)
        self.end = end_offset
        if len(self.records) >= self.chunk_records:
            self.write_chunk()

    def close(self) -> None:
        """The run ends: the last records become a chunk, unless this process never filled
        one (a small stream parses fast; no ``train.cols/`` clutters a small run)."""
        if self.chunks_written:
            self.write_chunk()
        self.records = []

    def write_chunk(self) -> None:
        """Write the buffered records as one chunk (best effort; off for good on any failure)."""
        if self.broken or not self.records:
            return
        try:
            self._write_chunk()
        except Exception:
            self.broken = True
        self.records = []
        self.start = self.end
        self.head = self.tail = b""

    def _write_chunk(self) -> None:
        import polars as pl

        from flightlog.protocol import RUN_START

        by_type: dict[str, tuple[list[dict[str, Any]], list[int], list[int]]] = {}
        starts: list[dict[str, Any]] = []
        seg_in = self.segment
        segment = self.segment
        for row, record in enumerate(self.records):
            kind = record.get("type")
            if kind == RUN_START:
                segment = int(record.get("segment", 0) or 0)
                starts.append({"type": RUN_START, "segment": segment, "resumed_from_step": record.get("resumed_from_step")})
            if segment is None or type(kind) is not str:
                raise ValueError("a record before this process's run_start")
            group = by_type.get(kind)
            if group is None:
                group = by_type[kind] = ([], [], [])
            group[0].append(record)
            group[1].append(segment)
            group[2].append(row)
        self.folder.mkdir(exist_ok=True)
        counts = {}
        for kind, (records, segments, rows) in by_type.items():
            frame = pl.from_dicts(records, infer_schema_length=None, strict=False)
            frame = restore_numeric(frame).with_columns(
                pl.Series("segment", segments, dtype=pl.Int64), pl.Series("_row", rows, dtype=pl.Int64)
            )
            if "timestamp" in frame.columns and frame.schema["timestamp"] == pl.String:
                frame = frame.with_columns(pl.col("timestamp").str.to_datetime(TIMESTAMP_FORMAT, time_zone="UTC", strict=False))
            target = self.folder / chunk_file(self.start, kind)
            tmp = target.with_name(f".{target.name}.tmp")
            frame.write_ipc(tmp)
            os.replace(tmp, target)
            counts[kind] = frame.height
        line = {
            "format": FORMAT, "start": self.start, "end": self.end, "rows": len(self.records), "types": counts,
            "segment_in": seg_in, "segment_out": segment, "run_starts": starts,
            "head": edge_hash(self.head), "tail": edge_hash(self.tail),
        }  # fmt: skip
        fd = os.open(self.folder / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
        finally:
            os.close(fd)
        self.segment = segment
        self.chunks_written += 1


def chunk_file(start: int, kind: str) -> str:
    return f"{start:015d}.{kind}.arrow"


def restore_numeric(frame: Any) -> Any:
    """Columns that mix numbers and "NaN"/"Infinity" strings come back as Float64 (the
    same rule the JSONL reader applies, so both paths give the same columns)."""
    import polars as pl

    casts = []
    for name, dtype in frame.schema.items():
        if dtype != pl.String or name in ("type", "timestamp", "run_id"):
            continue
        column = frame.get_column(name)
        as_float = column.cast(pl.Float64, strict=False)
        if as_float.null_count() == column.null_count() and column.null_count() < len(column):
            casts.append(as_float.alias(name))
    return frame.with_columns(casts) if casts else frame
