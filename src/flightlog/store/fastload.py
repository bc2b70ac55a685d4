"""The fast path from a stream file to a DataFrame (what ``flightlog.load`` uses): the
writer's columnar sidecar, else vectorised JSON parsing, else a columnar cache.

``train.jsonl`` written with ``columnar=True`` (the default) has Arrow chunks in
``train.cols/`` (:mod:`flightlog.sinks.columnar`); the chunks whose edge hashes match
the file are read as they are and only the bytes no chunk covers are parsed as JSON, so
even the first load of a big run parses almost no JSON.

:func:`flightlog.store.reader.load_polars` walks the lines in Python to sort them by
type; here that happens inside Polars: the file is read as one string column, the
record type is a regex over the column, segments are a cumulative count of
``run_start`` lines, and all wanted lines go to ``pyarrow.json`` in one call. Lines that
hold the protocol's ``"NaN"``/``"Infinity"`` strings (rare: a metric blew up) are
decoded in Python so they come back as floats. Anything unusual (a corrupt line in
the middle, values whose type changes from number to text, invalid UTF-8) falls back
to ``reader.load_polars``, which handles every case line by line.

A stream is append-only, so a parse of its first N bytes stays valid: the parse is
kept as an Arrow IPC file under ``FLIGHTLOG_HOME/cache`` (streams of 8 MiB or more),
checked against the file's identity and the bytes around N, and only the new tail is
parsed on the next load. The source files are never written.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from flightlog.protocol import RECORD_TYPES, RUN_START, STREAM_FILE, decode, superseded_after

if TYPE_CHECKING:
    import pandas
    import polars

CACHE_MIN_BYTES = 8 * 1024 * 1024
CACHE_VERSION = 2
_TYPE = r'^\{"type":"([A-Za-z_]+)"'
_NONFINITE = ('":"NaN"', '":"Infinity"', '":"-Infinity"')
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S%.3fZ"

# One parsed file: {type: frame with "segment" and "_row"}, its run_starts, the segment at its end.
Parsed = tuple[dict[str, "polars.DataFrame"], list[dict[str, Any]], int]


fallbacks = 0  # loads handed to the line-by-line reader (tests and benchmarks read it)
sidecar_files = 0  # stream files read from the writer's columnar sidecar (likewise)


class _Fallback(Exception):
    """The fast path cannot take this input; the line-by-line reader will."""


def load_polars(
    path_or_run: Any,
    types: Iterable[str] | str | None = ("metrics",),
    include_superseded: bool = False,
    cache: bool = True,
    sidecar: bool = True,
) -> "polars.DataFrame":
    """Same rows as :func:`flightlog.store.reader.load_polars`, faster; ``types=None`` for all.

    Columns that are null in every selected row are left out.
    """
    import polars as pl

    from flightlog.store import reader

    if isinstance(types, str):
        types = (types,)
    wanted = sorted(RECORD_TYPES) if types is None else list(types)
    files = reader.stream_files(path_or_run)
    parts = []
    run_starts: list[dict[str, Any]] = []
    segment, offset = 0, 0
    try:
        for path in files:
            by_type, starts, segment = _file_frames(path, segment, cache, wanted, sidecar)
            run_starts += starts
            rows = 0
            for kind in wanted:
                frame = by_type.get(kind)
                if frame is not None and frame.height:
                    parts.append(frame.with_columns(pl.col("_row") + offset) if offset else frame)
            rows = max((int(f.get_column("_row").max() or 0) + 1 for f in by_type.values() if f.height), default=0)
            offset += rows
    except _Fallback:
        global fallbacks
        fallbacks += 1
        return reader.load_polars(path_or_run, types=wanted, include_superseded=include_superseded)
    if not parts:
        return pl.DataFrame({"type": [], "timestamp": [], "step": []}, schema={"type": pl.String, "timestamp": pl.String, "step": pl.Int64})
    frame = pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        frame = frame.sort("_row")
    frame = frame.drop("_row")
    if not include_superseded and "step" in frame.columns and run_starts:
        limits = {seg: lim for seg, lim in superseded_after(run_starts).items() if lim != math.inf}
        if limits:
            limit = pl.col("segment").replace_strict(limits, default=None, return_dtype=pl.Float64)
            frame = frame.filter(limit.is_null() | pl.col("step").is_null() | (pl.col("step") <= limit) | (pl.col("type") == RUN_START))
    return frame


def load(path_or_run: Any, types: Iterable[str] | str | None = ("metrics",), include_superseded: bool = False, cache: bool = True) -> "pandas.DataFrame":
    """:func:`load_polars` as a pandas DataFrame."""
    return load_polars(path_or_run, types, include_superseded, cache).to_pandas()


# ---------------------------------------------------------------------- one file
def _file_frames(path: Path, segment: int, cache: bool, wanted: list[str], sidecar: bool = True) -> Parsed:
    """The records of one stream file by type. Cached files hold every type (one cache
    serves every query); others parse only the ``wanted`` ones."""
    from flightlog.store import reader

    if sidecar and path.suffix != ".gz" and path.name == STREAM_FILE:
        written = _from_sidecar(path, segment, wanted)
        if written is not None:
            return written
    if cache and path.suffix != ".gz":
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise _Fallback from exc
        if size >= CACHE_MIN_BYTES:
            return _cached(path, size, segment, wanted)
    return _parse(reader.read_bytes(path), segment, path, wanted)


def _parse(data: bytes, segment: int, source: Path, wanted: list[str] | None = None, complete_only: bool = False) -> Parsed:
    """Records of the lines in ``data`` (of the ``wanted`` types, default all).

    The segment carries over from earlier bytes. A last line without its newline is
    kept only when it parses whole (and never with ``complete_only``).
    """
    import polars as pl

    from flightlog.store.reader import StreamWarning

    tail_start = data.rfind(b"\n") + 1
    if tail_start < len(data):
        tail = data[tail_start:]
        try:
            if complete_only:
                raise orjson.JSONDecodeError("incomplete", "", 0)
            orjson.loads(tail)
            data = data + b"\n"
        except orjson.JSONDecodeError:
            data = data[:tail_start]
            if tail.strip() and not complete_only:
                warnings.warn(f"flightlog: skipped a torn last line in {source} ({len(tail)} bytes; the writer was stopped mid-line)", StreamWarning, stacklevel=5)
    if not data.strip():
        return {}, [], segment
    if b'":"NaN"' not in data and b'Infinity"' not in data:
        direct = _parse_direct(data, segment, wanted)
        if direct is not None:
            return direct
    try:
        lines = pl.read_csv(
            io.BytesIO(data), has_header=False, separator="\x01", quote_char=None, new_columns=["line"], schema={"line": pl.String}
        )
    except Exception as exc:  # invalid UTF-8, a stray \x01: not our writer's output
        raise _Fallback from exc
    lines = lines.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"))
    lines = lines.filter(pl.col("line").str.strip_chars() != "").with_columns(pl.col("line").str.extract(_TYPE, 1).alias("type"))
    if lines.get_column("type").null_count():
        raise _Fallback  # lines that do not start with {"type": ...}: another writer, or damage

    try:
        starts = [decode(s) for s in lines.filter(pl.col("type") == RUN_START).get_column("line").to_list()]
    except ValueError as exc:
        raise _Fallback from exc
    segments = [int(s.get("segment", 0) or 0) for s in starts]
    mapping = {i: seg for i, seg in enumerate(segments)}
    mapping[-1] = segment
    lines = lines.with_columns(
        ((pl.col("type") == RUN_START).cast(pl.Int64).cum_sum() - 1).replace_strict(mapping, return_dtype=pl.Int64).alias("segment"),
    )
    if wanted is not None:
        lines = lines.filter(pl.col("type").is_in(wanted))
    odd = pl.any_horizontal([pl.col("line").str.contains(s, literal=True) for s in _NONFINITE])
    lines = lines.with_columns(odd.alias("_odd"))
    by_type = {str(kind[0]): _parse_group(group) for kind, group in lines.group_by("type", maintain_order=True)}
    return by_type, starts, segments[-1] if segments else segment


def _parse_direct(data: bytes, segment: int, wanted: list[str] | None) -> Parsed | None:
    """The common case in one call: Arrow parses the whole file, Polars splits it by type.

    None when the file needs the line-wise path (a value whose type changes between
    records, a line without a type, a corrupt line).
    """
    import polars as pl
    import pyarrow.json as pj

    try:
        frame = pl.from_arrow(pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(block_size=4 << 20)))
    except Exception:
        return None
    if not isinstance(frame, pl.DataFrame) or "type" not in frame.columns or frame.schema["type"] != pl.String or frame.get_column("type").null_count():
        return None
    is_start = pl.col("type") == RUN_START
    starts = []
    if "segment" in frame.columns:
        rows = frame.filter(is_start).select([c for c in ("segment", "resumed_from_step") if c in frame.columns])
        starts = [{"type": RUN_START, **r} for r in rows.to_dicts()]
    elif frame.filter(is_start).height:
        starts = [{"type": RUN_START, "segment": 0}] * frame.filter(is_start).height
    segments = [int(r.get("segment") or 0) for r in starts]
    mapping = {i: seg for i, seg in enumerate(segments)}
    mapping[-1] = segment
    frame = frame.with_columns(
        (is_start.cast(pl.Int64).cum_sum() - 1).replace_strict(mapping, return_dtype=pl.Int64).alias("segment"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"),
    )
    if "timestamp" in frame.columns and frame.schema["timestamp"] == pl.String:
        frame = frame.with_columns(pl.col("timestamp").str.to_datetime(_TS_FORMAT, time_zone="UTC", strict=False))
    by_type = {}
    for (kind,), group in frame.group_by("type", maintain_order=True):
        if wanted is not None and kind not in wanted:
            continue
        by_type[str(kind)] = group.select([c for c in group.columns if group.get_column(c).null_count() < group.height])
    return by_type, starts, segments[-1] if segments else segment


def _parse_group(lines: "polars.DataFrame") -> "polars.DataFrame":
    """Lines of one record type: Arrow's parser for most, Python for the rare non-finite ones."""
    import polars as pl
    import pyarrow.json as pj

    from flightlog.store.reader import restore_numeric

    plain = lines.filter(~pl.col("_odd"))
    rare = lines.filter(pl.col("_odd"))
    frames = []
    if plain.height:
        text = plain.select(pl.col("line").str.join("\n")).item().encode()
        try:
            frame = pl.from_arrow(pj.read_json(io.BytesIO(text), read_options=pj.ReadOptions(block_size=4 << 20)))
        except Exception:  # a field that is a number here and text there: Polars' inference copes
            try:
                frame = restore_numeric(pl.read_ndjson(io.BytesIO(text), infer_schema_length=None))
            except Exception as exc:
                raise _Fallback from exc
        if not isinstance(frame, pl.DataFrame) or frame.height != plain.height:
            raise _Fallback
        frames.append(frame.with_columns(plain.get_column("segment"), plain.get_column("_row")))
    if rare.height:
        records = [decode(line) for line in rare.get_column("line").to_list()]
        frames.append(pl.DataFrame(records, infer_schema_length=None, strict=False).with_columns(rare.get_column("segment"), rare.get_column("_row")))
    frame = pl.concat(frames, how="diagonal_relaxed").sort("_row") if len(frames) > 1 else frames[0]
    if "timestamp" in frame.columns and frame.schema["timestamp"] == pl.String:
        frame = frame.with_columns(pl.col("timestamp").str.to_datetime(_TS_FORMAT, time_zone="UTC", strict=False))
    return frame


# ---------------------------------------------------------------------- sidecar
def _from_sidecar(path: Path, segment: int, wanted: list[str]) -> Parsed | None:
    """The file's records from the writer's Arrow chunks (:mod:`flightlog.sinks.columnar`),
    with the bytes no chunk covers (the live tail, a crashed process's last records)
    parsed from the JSONL. None when there are no chunks or they do not match the file."""
    import polars as pl

    from flightlog.sinks.columnar import EDGE_BYTES, FORMAT, MANIFEST, SIDECAR_DIR, chunk_file, edge_hash

    folder = path.parent / SIDECAR_DIR
    try:
        manifest = (folder / MANIFEST).read_bytes()
        size = path.stat().st_size
    except OSError:
        return None
    chunks = []
    for line in manifest.split(b"\n"):
        try:
            chunk = orjson.loads(line)
            if chunk["format"] == FORMAT and 0 <= chunk["start"] < chunk["end"] <= size:
                chunks.append(chunk)
        except (orjson.JSONDecodeError, TypeError, KeyError):
            continue  # a torn last manifest line (a crash mid-append), or another format
    chunks.sort(key=lambda c: c["start"])
    valid, pos = [], 0
    with open(path, "rb") as fh:
        for chunk in chunks:
            start, end = chunk["start"], chunk["end"]
            if start < pos:
                continue  # overlaps a chunk already taken: left over from an earlier file
            fh.seek(start)
            head = fh.read(min(EDGE_BYTES, end - start))
            fh.seek(max(start, end - EDGE_BYTES))
            tail = fh.read(end - max(start, end - EDGE_BYTES))
            if edge_hash(head) == chunk["head"] and edge_hash(tail) == chunk["tail"]:
                valid.append(chunk)
                pos = end
    covered = sum(c["end"] - c["start"] for c in valid)
    if covered < size // 2:
        return None  # mostly JSON anyway: the cache or a parse serves it as well
    frames: dict[str, list[Any]] = {}
    starts: list[dict[str, Any]] = []
    rows, pos = 0, 0

    def add(by_type: dict[str, Any], count: int) -> None:
        nonlocal rows
        for kind, frame in by_type.items():
            if frame.height:
                frames.setdefault(kind, []).append(frame.with_columns(pl.col("_row") + rows) if rows else frame)
        rows += count

    def gap(begin: int, end: int) -> None:
        nonlocal segment, starts
        with open(path, "rb") as fh:
            fh.seek(begin)
            data = fh.read(end - begin)
        by_type, more, segment = _parse(data, segment, path, wanted)
        starts += more
        add(by_type, data.count(b"\n") + 1)

    try:
        for chunk in valid:
            if chunk["start"] > pos:
                gap(pos, chunk["start"])
            if chunk["segment_in"] is not None and chunk["segment_in"] != segment:
                return None
            by_type = {k: pl.read_ipc(folder / chunk_file(chunk["start"], k)) for k in chunk["types"] if k in wanted}
            add(by_type, int(chunk["rows"]))
            starts += chunk["run_starts"]
            segment = int(chunk["segment_out"])
            pos = chunk["end"]
    except (OSError, pl.exceptions.PolarsError):
        return None  # a chunk file missing or damaged: parse the JSONL instead
    if pos < size:
        gap(pos, size)
    by_kind = {}
    for kind, parts in frames.items():
        frame = pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]
        by_kind[kind] = frame.select([c for c in frame.columns if frame.get_column(c).null_count() < frame.height])
    global sidecar_files
    sidecar_files += 1
    return by_kind, starts, segment


# ---------------------------------------------------------------------- cache
def _cache_dir() -> Path:
    from flightlog.store.index import home

    return home() / "cache"


def _fingerprint(path: Path, covered: int) -> dict[str, Any]:
    st = path.stat()
    with open(path, "rb") as fh:
        head = fh.read(min(4096, covered))
        fh.seek(max(0, covered - 4096))
        tail = fh.read(min(4096, covered))
    return {
        "version": CACHE_VERSION,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "covered": covered,
        "head": hashlib.sha1(head).hexdigest(),
        "tail": hashlib.sha1(tail).hexdigest(),
    }


def _cached(path: Path, size: int, segment: int, wanted: list[str]) -> Parsed:
    """The file's records from the cache plus a parse of what was appended since."""
    import polars as pl

    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:20]
    folder = _cache_dir()
    meta_path = folder / f"{key}.json"
    try:
        meta = orjson.loads(meta_path.read_bytes())
        covered = int(meta["fingerprint"]["covered"])
        valid = covered <= size and meta["fingerprint"] == _fingerprint(path, covered) and meta.get("segment_in") == segment
    except (OSError, ValueError, KeyError, TypeError):
        valid = False
    if valid:
        try:
            by_type = {k: pl.read_ipc(folder / f"{key}.{k}.arrow") for k in meta["types"] if k in wanted}
        except (OSError, pl.exceptions.PolarsError):
            valid = False
    if not valid:
        with open(path, "rb") as fh:
            data = fh.read(size)
        complete = data.rfind(b"\n") + 1
        by_type, starts, last = _parse(data[:complete], segment, path)
        _write_cache(path, folder, key, by_type, starts, segment, last, complete)
        if complete < size:  # a whole last line not yet terminated, or a torn one
            more, more_starts, last = _parse(data[complete:], last, path)
            by_type = _append(by_type, more, complete_rows=_rows(by_type))
            starts = starts + more_starts
        return {k: v for k, v in by_type.items() if k in wanted}, starts, last

    starts, last = list(meta["run_starts"]), int(meta["segment_out"])
    if covered < size:
        with open(path, "rb") as fh:
            fh.seek(covered)
            new = fh.read(size - covered)
        more, more_starts, last = _parse(new, last, path, wanted)
        by_type = _append(by_type, more, complete_rows=int(meta["rows"]))
        starts += more_starts
        if new.rfind(b"\n") + 1 > max(size // 4, CACHE_MIN_BYTES // 2):  # much new: refresh the cache
            _cached_refresh(path, size, segment)
    return by_type, starts, last


def _rows(by_type: dict[str, Any]) -> int:
    return max((int(f.get_column("_row").max() or 0) + 1 for f in by_type.values() if f.height), default=0)


def _append(by_type: dict[str, Any], more: dict[str, Any], complete_rows: int) -> dict[str, Any]:
    import polars as pl

    out = dict(by_type)
    for kind, frame in more.items():
        frame = frame.with_columns(pl.col("_row") + complete_rows)
        out[kind] = pl.concat([out[kind], frame], how="diagonal_relaxed") if kind in out else frame
    return out


def _cached_refresh(path: Path, size: int, segment: int) -> None:
    """Rewrite the cache for the whole file (the next load reads it back)."""
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:20]
    with open(path, "rb") as fh:
        data = fh.read(size)
    complete = data.rfind(b"\n") + 1
    by_type, starts, last = _parse(data[:complete], segment, path)
    _write_cache(path, _cache_dir(), key, by_type, starts, segment, last, complete)


def _write_cache(path: Path, folder: Path, key: str, by_type: dict[str, Any], starts: list[dict[str, Any]], seg_in: int, seg_out: int, covered: int) -> None:
    """Best effort: a cache that cannot be written only costs the next load time."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for kind, frame in by_type.items():
            target = folder / f"{key}.{kind}.arrow"
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            frame.write_ipc(tmp)
            os.replace(tmp, target)
        meta = {
            "source": str(path),
            "fingerprint": _fingerprint(path, covered),
            "types": sorted(by_type),
            "rows": _rows(by_type),
            "run_starts": starts,
            "segment_in": seg_in,
            "segment_out": seg_out,
        }
        meta_path = folder / f"{key}.json"
        tmp_meta = meta_path.with_name(f".{meta_path.name}.{os.getpid()}.tmp")
        tmp_meta.write_bytes(orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS, default=str))
        os.replace(tmp_meta, meta_path)
    except Exception:
        pass
