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
import io
import os
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import orjson

from flightlog.store.reader import restore_numeric

SIDECAR_DIR = "train.cols"
MANIFEST = "chunks.jsonl"
CHUNK_RECORDS = 65_536
SLICE_RECORDS = 16_384  # lines converted at a time (spreads the work over the chunk)
THREADED = True  # convert on a thread of the sidecar's own (False: on the writer thread)
MAX_QUEUED = 16  # slices waiting for the converter before the sidecar gives up
EDGE_BYTES = 64  # bytes hashed at each end of a chunk's byte range
FORMAT = 1
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S%.3fZ"


def edge_hash(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


class ColumnarSidecar:
    """Collects what the JSONL sink wrote (on the writer thread: list appends only) and
    converts and writes it as Arrow chunks on a thread of its own.

    The JSON lines the sink already encoded are parsed by Polars' NDJSON reader (the same
    parser and type rules as the JSONL loader, so both give the same columns) in slices of
    ``SLICE_RECORDS``. That parser releases the GIL, so neither the writer thread nor the
    training loop's ``Run.log`` waits for this work (``pl.from_dicts`` would hold the GIL
    for the whole conversion). If the converter falls more than ``MAX_QUEUED`` slices
    behind, the sidecar is switched off rather than hold the writer or memory."""

    def __init__(self, directory: str | os.PathLike[str], start_offset: int, chunk_records: int | None = None) -> None:
        self.folder = Path(directory) / SIDECAR_DIR
        self.chunk_records = chunk_records or CHUNK_RECORDS
        # writer-thread side: the current chunk
        self.start = start_offset  # where the current chunk begins in train.jsonl
        self.end = start_offset
        self.head = b""  # first bytes of the chunk's range
        self.tail = b""  # last bytes of the chunk's range
        self.rows = 0  # records in the current chunk (handed over or pending)
        self.lines: list[bytes] = []  # encoded lines not yet handed to the converter
        self.records: list[dict[str, Any]] = []  # the same records (for their keys)
        self.kinds: list[Any] = []  # their record types
        self.pending_starts: list[tuple[int, dict[str, Any]]] = []  # (index in lines, run_start summary)
        self.chunks_started = 0
        self.broken = False
        self._jobs: Any = None
        self._thread: Any = None
        # converter-thread side
        self.schemas: dict[str, Any] = {}  # per type: the last flat schema Polars inferred
        self.frames: dict[str, list[Any]] = {}  # converted slices of the chunk, by type
        self.starts: list[dict[str, Any]] = []  # run_start records of the chunk (segment, resumed_from_step)
        self.segment: int | None = None  # segment of the last converted record; None before this process's run_start
        self.segment_in: int | None = None
        self.chunks_written = 0

    # ------------------------------------------------------------------ writer thread
    def add(self, batch: list[dict[str, Any]], lines: list[bytes], data: bytes, end_offset: int) -> None:
        """``batch`` was encoded as ``lines`` and written as ``data`` (their join), which ends
        at ``end_offset`` of the stream."""
        if self.broken:
            return
        if end_offset - len(data) != self.end:  # bytes we did not see (a retry after ENOSPC)
            self.broken = True
            return
        from flightlog.protocol import RUN_START

        if not self.rows:
            self.head = data[:EDGE_BYTES]
        elif len(self.head) < EDGE_BYTES:
            self.head = (self.head + data)[:EDGE_BYTES]
        self.tail = (self.tail + data)[-EDGE_BYTES:] if len(data) < EDGE_BYTES else data[-EDGE_BYTES:]
        self.end = end_offset
        kinds = list(map(dict.get, batch, repeat("type")))
        if RUN_START in kinds:
            for i, kind in enumerate(kinds):
                if kind == RUN_START:
                    record = batch[i]
                    start = {"type": RUN_START, "segment": int(record.get("segment", 0) or 0), "resumed_from_step": record.get("resumed_from_step")}
                    self.pending_starts.append((len(self.lines) + i, start))
        self.lines += lines
        self.records += batch
        self.kinds += kinds
        self.rows += len(lines)
        if len(self.lines) >= SLICE_RECORDS:
            self._hand_over_slice()
        if self.rows >= self.chunk_records:
            self.end_chunk()

    def _hand_over_slice(self) -> None:
        if self.lines:
            self._submit(("slice", self.lines, self.records, self.kinds, self.pending_starts, self.rows - len(self.lines)))
        self.lines, self.records, self.kinds, self.pending_starts = [], [], [], []

    def end_chunk(self) -> None:
        """The current chunk is complete: have it written."""
        if self.rows and not self.broken:
            self._hand_over_slice()
            self._submit(("chunk", {"start": self.start, "end": self.end, "rows": self.rows, "head": self.head, "tail": self.tail}))
            self.chunks_started += 1
        self.lines, self.records, self.kinds, self.pending_starts = [], [], [], []
        self.rows = 0
        self.start = self.end
        self.head = self.tail = b""

    def close(self) -> None:
        """The run ends: the last records become a chunk, unless this process never filled
        one (a small stream parses fast; no ``train.cols/`` clutters a small run); then the
        converter finishes its work."""
        if self.chunks_started:
            self.end_chunk()
        self.lines, self.records, self.kinds, self.pending_starts = [], [], [], []
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _submit(self, job: tuple[Any, ...]) -> None:
        import queue
        import threading

        if self.broken:
            return
        if not THREADED:
            self._run(job)
            return
        if self._thread is None:
            self._jobs = queue.Queue(maxsize=MAX_QUEUED)
            self._thread = threading.Thread(target=self._work, name="flightlog-columnar", daemon=True)
            self._thread.start()
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.broken = True  # the converter cannot keep up: stop rather than slow the writer

    # ------------------------------------------------------------------ converter thread
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._run(job)
            finally:
                self._jobs.task_done()

    def _run(self, job: tuple[Any, ...]) -> None:
        if self.broken:
            return
        try:
            if job[0] == "slice":
                self._convert(*job[1:])
            else:
                self._write_chunk(job[1])
        except Exception:
            self.broken = True

    def wait(self) -> None:
        """Until every chunk handed over so far is written (tests, benchmarks)."""
        if self._jobs is not None:
            self._jobs.join()

    def _convert(self, lines: list[bytes], records: list[dict[str, Any]], kinds_list: list[Any], pending_starts: list[tuple[int, dict[str, Any]]], first_row: int) -> None:
        """Lines as Arrow frames by type, with their segment and row in the chunk."""
        import polars as pl

        kinds = pl.Series("type", kinds_list, dtype=pl.String, strict=True)
        if kinds.null_count():
            raise ValueError("a record without a type")
        if self.segment is None and (not pending_starts or pending_starts[0][0] != 0):
            raise ValueError("a record before this process's run_start")
        segment = None
        if pending_starts:
            is_start = pl.Series([False] * len(lines))
            is_start = is_start.scatter([i for i, _ in pending_starts], True)
            mapping = {-1: self.segment, **{n: start["segment"] for n, (_, start) in enumerate(pending_starts)}}
            segment = (is_start.cast(pl.Int64).cum_sum() - 1).replace_strict(mapping, return_dtype=pl.Int64)
            self.starts += [start for _, start in pending_starts]
            self.segment = pending_starts[-1][1]["segment"]
        unique = kinds.unique(maintain_order=True).to_list()
        for kind in unique:
            if len(unique) > 1:
                rows = (kinds == kind).arg_true()
                index = rows.to_list()
                text = b"".join([lines[i] for i in index])
                group = [records[i] for i in index]
            else:
                rows = pl.int_range(len(lines), dtype=pl.Int64, eager=True)
                text = b"".join(lines)
                group = records
            frame = self._parse(str(kind), text, group)
            if frame.height != len(rows):
                raise ValueError("lines and rows disagree")
            seg = pl.repeat(self.segment, len(rows), dtype=pl.Int64, eager=True) if segment is None else segment.gather(rows)
            frame = restore_numeric(frame).with_columns(seg.alias("segment"), (rows.cast(pl.Int64) + first_row).alias("_row"))
            if "timestamp" in frame.columns and frame.schema["timestamp"] == pl.String:
                frame = frame.with_columns(pl.col("timestamp").str.to_datetime(TIMESTAMP_FORMAT, time_zone="UTC", strict=False))
            self.frames.setdefault(str(kind), []).append(frame)

    def _parse(self, kind: str, text: bytes, records: list[dict[str, Any]]) -> Any:
        """Lines of one type as a frame, with the types Polars infers over all of them.

        Inferring over every line is most of the cost, so the schema inferred for this type
        is reused while it is flat and names every key; Polars refuses a value that does not
        fit it (a float in an Int64 column, "NaN" in a Float64 one), and then it is inferred
        again. (It would silently drop unknown keys and nested fields, hence the checks.)"""
        import polars as pl

        known = self.schemas.get(kind)
        if known is not None and set(chain.from_iterable(records)) <= known.keys():  # (C-level: the GIL is shared)
            try:
                frame = pl.read_ndjson(io.BytesIO(text), schema=known)
                return frame.select([c for c in frame.columns if frame.get_column(c).null_count() < frame.height])
            except pl.exceptions.PolarsError:
                pass
        frame = pl.read_ndjson(io.BytesIO(text), infer_schema_length=None)
        flat = all(not dtype.is_nested() and dtype != pl.Object for dtype in frame.schema.values())
        if flat:
            merged = dict(known or {})
            for name, dtype in frame.schema.items():  # a column null in this slice keeps its earlier type
                if dtype != pl.Null or name not in merged:
                    merged[name] = dtype
            self.schemas[kind] = merged
        else:
            self.schemas.pop(kind, None)
        return frame

    def _write_chunk(self, chunk: dict[str, Any]) -> None:
        import polars as pl

        self.folder.mkdir(exist_ok=True)
        counts = {}
        for kind, parts in self.frames.items():
            frame = pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]
            target = self.folder / chunk_file(chunk["start"], kind)
            tmp = target.with_name(f".{target.name}.tmp")
            frame.write_ipc(tmp)
            os.replace(tmp, target)
            counts[kind] = frame.height
        line = {
            "format": FORMAT, "start": chunk["start"], "end": chunk["end"], "rows": chunk["rows"], "types": counts,
            "segment_in": self.segment_in, "segment_out": self.segment, "run_starts": self.starts,
            "head": edge_hash(chunk["head"]), "tail": edge_hash(chunk["tail"]),
        }  # fmt: skip
        fd = os.open(self.folder / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
        finally:
            os.close(fd)
        self.chunks_written += 1
        self.frames, self.starts = {}, []
        self.segment_in = self.segment


def chunk_file(start: int, kind: str) -> str:
    return f"{start:015d}.{kind}.arrow"
