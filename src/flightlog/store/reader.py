"""Loading a run's records: every stream file, torn lines skipped, superseded records hidden.

Two paths share one file scan:

* :func:`read_records` yields plain dicts (non-finite numbers restored), for tools
  that walk records one by one (doctor, importers, tail).
* :func:`load_polars` builds a DataFrame with Polars' multi-threaded NDJSON reader; it
  is the careful reference that :mod:`flightlog.store.fastload` falls back to, and
  :func:`load` (``flightlog.load``) goes through the fast loader. Our writer puts ``type`` first on every line, so lines are sorted by
  type with a byte-prefix check and only the rare ``run_start`` lines are decoded in
  Python (to find segments and resumes).

A torn last line (a process killed mid-write) is skipped with a warning; a corrupt line
in the middle is skipped and counted, never fatal. A record from an earlier process
segment whose step lies beyond the step a later segment resumed from is superseded
(see :func:`flightlog.protocol.superseded_after`); it stays on disk but is hidden
unless ``include_superseded=True``.
"""

from __future__ import annotations

import io
import math
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import orjson

from flightlog.protocol import RUN_START, STREAM_FILE, decode, superseded_after

if TYPE_CHECKING:
    import pandas
    import polars

_TYPE_PREFIX = b'{"type":"'


class StreamWarning(UserWarning):
    """A line of a record stream could not be read (torn or corrupt) and was skipped."""


@dataclass
class ScanReport:
    """What a scan found besides records: for warnings, tests and ``flightlog doctor``."""

    files: list[Path] = field(default_factory=list)
    torn_lines: int = 0
    corrupt_lines: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        self.problems.append(message)
        warnings.warn(message, StreamWarning, stacklevel=4)


# ---------------------------------------------------------------------- files
def resolve_run_dir(path_or_run: Any) -> Path:
    """The directory holding ``train.jsonl`` for a Run, a run dir, an output dir or a stream file."""
    if hasattr(path_or_run, "log_dir"):
        return Path(path_or_run.log_dir)
    path = Path(path_or_run)
    if path.is_file():
        return path.parent
    if (path / STREAM_FILE).exists() or any(path.glob("train.*.jsonl.gz")):
        return path
    if (path / "logs").is_dir():
        return path / "logs"
    if not path.exists():
        raise FileNotFoundError(f"flightlog: no run at {str(path)!r} (the path does not exist)")
    raise FileNotFoundError(
        f"flightlog: no record stream in {str(path)!r}: expected {STREAM_FILE} or train.NNNNN.jsonl.gz "
        "there or in its logs/ folder"
    )


def stream_files(path_or_run: Any) -> list[Path]:
    """The stream files of a run, oldest first (plain and gzip segments may be mixed across processes)."""
    path = Path(path_or_run) if not hasattr(path_or_run, "log_dir") else None
    if path is not None and path.is_file():
        return [path]
    run_dir = resolve_run_dir(path_or_run)
    files = sorted(run_dir.glob("train.*.jsonl.gz"))
    plain = run_dir / STREAM_FILE
    if plain.exists():
        files.append(plain)
    if len(files) > 1:
        files.sort(key=_first_timestamp)
    return files


def _first_timestamp(path: Path) -> str:
    data = read_bytes(path, limit=65536)
    first = data.split(b"\n", 1)[0]
    try:
        return str(orjson.loads(first).get("timestamp", ""))
    except (orjson.JSONDecodeError, AttributeError):
        return ""


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """A stream file's bytes; gzip segments are decompressed, a segment still being
    written (no gzip trailer yet) yields everything flushed so far."""
    raw = path.read_bytes() if limit is None else _head(path, limit)
    if path.suffix != ".gz":
        return raw
    out = []
    while raw:
        d = zlib.decompressobj(wbits=31)
        try:
            out.append(d.decompress(raw))
        except zlib.error:
            break
        if not d.eof:  # truncated: a live segment, or a process killed mid-segment
            break
        raw = d.unused_data
    return b"".join(out)


def _head(path: Path, limit: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(limit)


# ---------------------------------------------------------------------- lines
def split_lines(data: bytes, source: Path, report: ScanReport) -> list[bytes]:
    """Complete lines; a last line without its newline is kept only if it parses whole."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends with a newline
    if tail.strip():
        try:
            orjson.loads(tail)
            lines.append(tail)
        except orjson.JSONDecodeError:
            report.torn_lines += 1
            report.note(f"flightlog: skipped a torn last line in {source} ({len(tail)} bytes; the writer was stopped mid-line)")
    return lines


def _record_type(line: bytes) -> str | None:
    if line.startswith(_TYPE_PREFIX):
        end = line.find(b'"', len(_TYPE_PREFIX))
        if end > 0:
            return line[len(_TYPE_PREFIX):end].decode()
    return None


def _decode_or_note(line: bytes, source: Path, number: int, report: ScanReport) -> dict[str, Any] | None:
    try:
        return decode(line)
    except (ValueError, orjson.JSONDecodeError) as exc:
        report.corrupt_lines += 1
        if report.corrupt_lines <= 10:
            report.note(f"flightlog: skipped unreadable line {number} of {source}: {exc}")
        return None


@dataclass
class _Scan:
    """Lines grouped by record type, with the process segment each line belongs to."""

    lines: dict[str, list[bytes]]
    segments: dict[str, list[int]]
    run_starts: list[dict[str, Any]]
    report: ScanReport


def _scan(files: Sequence[Path], types: Iterable[str] | None) -> _Scan:
    wanted = None if types is None else set(types)
    report = ScanReport(files=list(files))
    lines: dict[str, list[bytes]] = {}
    segments: dict[str, list[int]] = {}
    run_starts: list[dict[str, Any]] = []
    segment = 0
    for path in files:
        for number, line in enumerate(split_lines(read_bytes(path), path, report), start=1):
            kind = _record_type(line)
            if kind is None:
                if not line.strip():
                    continue
                record = _decode_or_note(line, path, number, report)
                if record is None:
                    continue
                kind = str(record.get("type"))
                line = orjson.dumps(record)  # normalised so every kept line is valid
            if kind == RUN_START:
                record = _decode_or_note(line, path, number, report)
                if record is None:
                    continue
                segment = int(record.get("segment", 0) or 0)
                run_starts.append(record)
            if wanted is not None and kind not in wanted:
                continue
            bucket = lines.get(kind)
            if bucket is None:
                bucket = lines[kind] = []
                segments[kind] = []
            bucket.append(line)
            segments[kind].append(segment)
    return _Scan(lines, segments, run_starts, report)


# ---------------------------------------------------------------------- records
def tagged_records(path_or_run: Any, report: ScanReport | None = None) -> list[tuple[int, dict[str, Any]]]:
    """``(segment, record)`` for every record of a run in file order, superseded ones included.

    ``report`` (optional) receives the counts of torn and corrupt lines that were skipped.
    """
    files = stream_files(path_or_run)
    scan = _scan(files, None)
    if report is not None:
        report.files, report.torn_lines, report.corrupt_lines = scan.report.files, scan.report.torn_lines, scan.report.corrupt_lines
        report.problems = scan.report.problems
    out = []
    for segment, line in _merge_in_order(scan):
        record = _decode_or_note(line, files[0], 0, scan.report)
        if record is not None:
            out.append((segment, record))
    return out


def read_records(
    path_or_run: Any,
    types: Iterable[str] | None = None,
    include_superseded: bool = False,
    report: ScanReport | None = None,
) -> Iterator[dict[str, Any]]:
    """Every record of a run in file order, as dicts (non-finite numbers restored)."""
    wanted = None if types is None else set(types)
    tagged = tagged_records(path_or_run, report)
    limits = superseded_after([r for _, r in tagged if r.get("type") == RUN_START])
    for segment, record in tagged:
        if wanted is not None and record.get("type") not in wanted:
            continue
        if not include_superseded and _is_superseded(record, segment, limits):
            continue
        yield record


def _merge_in_order(scan: _Scan) -> list[tuple[int, bytes]]:
    """Lines of all types back in file order (scan grouped them by type)."""
    # Timestamps are written in order per process, and segments follow each other, so
    # (segment, timestamp) restores the file order; ties keep the stable grouping order.
    entries = []
    for kind, lines in scan.lines.items():
        for seg, line in zip(scan.segments[kind], lines):
            ts = line.find(b'"timestamp":"')
            stamp = line[ts + 13 : ts + 37] if ts >= 0 else b""
            entries.append((seg, stamp, line))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [(seg, line) for seg, _, line in entries]


def _is_superseded(record: dict[str, Any], segment: int, limits: dict[int, float]) -> bool:
    step = record.get("step")
    limit = limits.get(segment, math.inf)
    return isinstance(step, (int, float)) and record.get("type") != RUN_START and step > limit


# ---------------------------------------------------------------------- frames
def load_polars(
    path_or_run: Any,
    types: Iterable[str] = ("metrics",),
    include_superseded: bool = False,
) -> "polars.DataFrame":
    """A Polars DataFrame of the chosen record types, one row a record.

    Columns: the record fields, ``timestamp`` as a UTC datetime, and ``segment`` (the
    process segment that wrote the record). Columns whose values are numbers or
    non-finite strings become Float64.
    """
    import polars as pl

    files = stream_files(path_or_run)
    scan = _scan(files, types)
    limits = superseded_after(scan.run_starts)
    frames = []
    for kind, lines in scan.lines.items():
        frames.append(_frame_from_lines(lines, scan.segments[kind], scan.report))
    if not frames:
        return pl.DataFrame({"type": [], "timestamp": [], "step": []}, schema={"type": pl.String, "timestamp": pl.String, "step": pl.Int64})
    frame = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
    if not include_superseded and "step" in frame.columns:
        finite = {seg: lim for seg, lim in limits.items() if lim != math.inf}
        if finite:
            limit = pl.col("segment").replace_strict(finite, default=None, return_dtype=pl.Float64)
            frame = frame.filter(limit.is_null() | pl.col("step").is_null() | (pl.col("step") <= limit) | (pl.col("type") == RUN_START))
    if "timestamp" in frame.columns and frame.schema["timestamp"] == pl.String:
        frame = frame.with_columns(pl.col("timestamp").str.to_datetime("%Y-%m-%dT%H:%M:%S%.3fZ", time_zone="UTC", strict=False))
    if len(frames) > 1 and "timestamp" in frame.columns:
        frame = frame.sort(["segment", "timestamp"], maintain_order=True)
    return frame


def _frame_from_lines(lines: list[bytes], segments: list[int], report: ScanReport) -> "polars.DataFrame":
    import polars as pl

    try:
        frame = pl.read_ndjson(io.BytesIO(b"\n".join(lines)), infer_schema_length=None)
    except Exception:
        # A corrupt line somewhere: validate line by line, keep the good ones.
        good, good_segments = [], []
        for number, (line, segment) in enumerate(zip(lines, segments), start=1):
            try:
                orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                report.corrupt_lines += 1
                if report.corrupt_lines <= 10:
                    report.note(f"flightlog: skipped unreadable record {number}: {exc}")
                continue
            good.append(line)
            good_segments.append(segment)
        frame = pl.read_ndjson(io.BytesIO(b"\n".join(good)), infer_schema_length=None) if good else pl.DataFrame()
        segments = good_segments
    frame = frame.with_columns(pl.Series("segment", segments, dtype=pl.Int64))
    return restore_numeric(frame)


def restore_numeric(frame: "polars.DataFrame") -> "polars.DataFrame":
    """Columns that mix numbers and "NaN"/"Infinity" strings come back as Float64."""
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


def load(
    path_or_run: Any,
    types: Iterable[str] | str = ("metrics",),
    include_superseded: bool = False,
) -> "pandas.DataFrame":
    """A run's records as a pandas DataFrame (metrics by default; ``types=None`` for all).

    Accepts a :class:`flightlog.Run`, a run's log directory, its output directory
    (``OUTPUT_DIR/logs`` is found), or one stream file. Non-finite numbers come back as
    floats, torn last lines are skipped with a :class:`StreamWarning`, and records
    superseded by a resumed segment are hidden. Rows are in file order; columns null in
    every row are left out. Read through :mod:`flightlog.store.fastload` (the writer's
    columnar sidecar where there is one), which hands anything unusual to :func:`load_polars`.
    """
    from flightlog.store import fastload

    return fastload.load_polars(path_or_run, types=types, include_superseded=include_superseded).to_pandas()
