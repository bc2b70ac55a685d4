"""The writer's columnar sidecar (train.cols/) loads the same rows as parsing the JSONL."""

from __future__ import annotations

import math
import os

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import flightlog
from flightlog.config import ConfigError
from flightlog.protocol import RECORD_TYPES, encode
from flightlog.sinks import columnar
from flightlog.store import fastload, reader


@pytest.fixture(autouse=True)
def small_chunks(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("FLIGHTLOG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FLIGHTLOG_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(columnar, "CHUNK_RECORDS", 40)  # many chunks from a small run
    monkeypatch.setattr(columnar, "SLICE_RECORDS", 16)  # each converted in several slices


def start_run(tmp_path, **kw):
    kw.setdefault("output_dir", tmp_path / "out")
    return flightlog.init(sinks=["jsonl"], install_signal_handlers=False, config={"lora_rank": 8}, **kw)


def log_steps(run, steps):
    for step in steps:
        loss = math.nan if step % 37 == 0 else (math.inf if step % 53 == 0 else 1.0 / step)
        run.log({"loss": loss, "grad_norm": 0.5 + step % 7, "stage": "warmup" if step < 10 else "stable"}, step=step)
        if step % 25 == 0:
            run.log({"eval_loss": 2.0 / step, "eval_accuracy": step / 1000}, step=step)
            run.event(f"saved checkpoint-{step}", step=step)


def same(path, types=("metrics",), **kw):
    """The sidecar load equals the line-by-line reader and the JSONL-only fast path."""
    before = fastload.sidecar_files
    got = fastload.load_polars(path, types=types, **kw)
    assert fastload.sidecar_files == before + 1, "the sidecar was not used"
    for expected in (reader.load_polars(path, types=types, **kw), fastload.load_polars(path, types=types, sidecar=False, cache=False, **kw)):
        assert got.height == expected.height
        for kind in expected["type"].unique():
            want = expected.filter(pl.col("type") == kind)
            have = got.filter(pl.col("type") == kind)
            keep = sorted(c for c in want.columns if want.get_column(c).null_count() < want.height)
            assert sorted(c for c in have.columns if have.get_column(c).null_count() < have.height) == keep
            order = [c for c in ("step", "timestamp", "message") if c in keep]
            assert_frame_equal(have.select(keep).sort(order, maintain_order=True), want.select(keep).sort(order, maintain_order=True), check_dtypes=False)
    return got


def chunk_lines(log_dir):
    return (log_dir / columnar.SIDECAR_DIR / columnar.MANIFEST).read_bytes().splitlines()


def test_finished_run_loads_from_chunks(tmp_path):
    """A finished run is read from its chunks: every type, NaN/inf, strings, datetimes."""
    run = start_run(tmp_path)
    log_steps(run, range(1, 301))
    run.finish()
    assert len(chunk_lines(run.log_dir)) >= 2
    frame = same(run.log_dir)
    assert frame["step"].to_list() == sorted(frame["step"].to_list()) and frame.height == 312
    assert math.isnan(frame.filter(pl.col("step") == 37)["loss"][0]) and frame.filter(pl.col("step") == 53)["loss"][0] == math.inf
    assert frame.schema["timestamp"] == pl.Datetime(frame.schema["timestamp"].time_unit, "UTC")
    everything = same(run.log_dir, types=sorted(RECORD_TYPES))
    assert {"run_start", "metrics", "event", "run_end"} <= set(everything["type"])
    pandas_frame = flightlog.load(run.log_dir, types="event")
    assert pandas_frame["message"].tolist()[0] == "saved checkpoint-25"


def test_live_tail_and_torn_line_read_from_jsonl(tmp_path):
    """Records not yet in a chunk (a live run) come from the JSONL; a torn last line warns."""
    run = start_run(tmp_path)
    log_steps(run, range(1, 120))
    run.flush()
    run.writer.sinks[0]._sidecar.wait()  # chunks are written by the sidecar's own thread
    path = run.log_dir / "train.jsonl"
    with_tail = same(run.log_dir)
    assert with_tail["step"].max() == 119
    run.finish()
    with open(path, "ab") as fh:  # another writer's half line after the run
        fh.write(encode({"type": "metrics", "timestamp": "2026-01-01T00:00:00.000Z", "run_id": "r", "step": 500, "loss": 1.0})[:30])
    with pytest.warns(reader.StreamWarning, match="torn last line"):
        assert fastload.load_polars(run.log_dir)["step"].max() == 119


def test_resume_crash_gap_and_superseded(tmp_path):
    """Segment 0 crashed with records never chunked; segment 1 resumed: the gap is parsed
    from the JSONL, superseded records are hidden, segments are right."""
    first = start_run(tmp_path)
    log_steps(first, range(1, 60))
    first.flush()
    first.writer.sinks[0]._sidecar.broken = True  # what a crash does: the last chunk is never written
    first.finish("failed")
    second = start_run(tmp_path, resumed_from_step=50)
    log_steps(second, range(51, 130))
    second.finish()
    frame = same(second.log_dir)
    steps = frame.filter(pl.col("loss").is_not_null() | pl.col("loss").is_nan())["step"].to_list()
    assert steps == list(range(1, 130))
    assert frame.filter(pl.col("step") == 55)["segment"].to_list() == [1]
    assert same(second.log_dir, include_superseded=True).height > frame.height
    assert flightlog.load(second)["step"].is_monotonic_increasing


def test_rewritten_stream_ignores_stale_chunks(tmp_path):
    """Chunks that no longer match the file's bytes are not served; the JSONL is parsed."""
    run = start_run(tmp_path)
    log_steps(run, range(1, 200))
    run.finish()
    path = run.log_dir / "train.jsonl"
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"grad_norm":', b'"grad_nurm":'))
    before = fastload.sidecar_files
    frame = fastload.load_polars(run.log_dir)
    assert fastload.sidecar_files == before and "grad_nurm" in frame.columns and "grad_norm" not in frame.columns


def test_corrupt_line_after_chunks_falls_back(tmp_path):
    """A corrupt line in the part no chunk covers goes to the careful reader (counted, warned)."""
    run = start_run(tmp_path)
    log_steps(run, range(1, 100))
    run.finish()
    path = run.log_dir / "train.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"type":"metrics","step":\n' + encode({"type": "metrics", "timestamp": "2026-01-01T00:00:00.000Z", "run_id": "r", "step": 100, "loss": 1.0}))
    before = fastload.fallbacks
    with pytest.warns(reader.StreamWarning, match="unreadable"):
        assert flightlog.load(run)["step"].max() == 100
    assert fastload.fallbacks == before + 1


def test_sidecar_failure_never_touches_jsonl(tmp_path):
    """If the sidecar cannot be written, the JSONL stream is complete and loads."""
    logs = tmp_path / "out" / "logs"
    logs.mkdir(parents=True)
    (logs / columnar.SIDECAR_DIR).write_text("in the way")
    run = start_run(tmp_path)
    log_steps(run, range(1, 100))
    run.finish()
    assert run.writer.sinks[0]._sidecar.broken
    assert flightlog.load(run)["step"].nunique() == 99


def test_off_by_config_and_for_gzip(tmp_path):
    """columnar=False writes no sidecar, nor does compressed mode; a bad value is refused."""
    run = start_run(tmp_path, columnar=False)
    log_steps(run, range(1, 60))
    run.finish()
    assert not (run.log_dir / columnar.SIDECAR_DIR).exists()
    gz = start_run(tmp_path, output_dir=tmp_path / "gz", compress=True)
    log_steps(gz, range(1, 60))
    gz.finish()
    assert not (gz.log_dir / columnar.SIDECAR_DIR).exists() and flightlog.load(gz)["step"].nunique() == 59
    with pytest.raises(ConfigError, match="columnar"):
        start_run(tmp_path, output_dir=tmp_path / "bad", columnar="yes")


def test_small_run_writes_no_sidecar(tmp_path, monkeypatch):
    """A process that never filled a chunk leaves no train.cols/ (its JSONL parses fast)."""
    monkeypatch.setattr(columnar, "CHUNK_RECORDS", 1000)
    run = start_run(tmp_path)
    log_steps(run, range(1, 100))
    run.finish()
    assert sorted(p.name for p in run.log_dir.iterdir()) == ["run.json", "train.jsonl"]


def test_types_that_change_between_slices(tmp_path):
    """Slices reuse the schema Polars inferred, never at the cost of a value: ints that turn
    float, numbers that turn "NaN", a number column that turns text, a key first seen late."""
    run = start_run(tmp_path)
    for step in range(1, 200):
        metrics = {"x": step if step < 50 else step + 0.5, "loss": math.nan if step == 120 else 1.0 / step}
        metrics["note"] = 1.5 if step < 150 else "n/a"
        if step == 170:
            metrics["late_key"] = 7
        run.log(metrics, step=step)
    run.finish()
    frame = same(run.log_dir)
    assert frame.schema["x"] == pl.Float64 and frame.filter(pl.col("step") == 60)["x"][0] == 60.5
    assert math.isnan(frame.filter(pl.col("step") == 120)["loss"][0])
    assert frame.filter(pl.col("step") == 170)["late_key"].to_list() == [7] and frame["late_key"].null_count() == 198
    assert frame.filter(pl.col("step") == 160)["note"].to_list() == ["n/a"]


def test_damaged_sidecar_is_never_served(tmp_path):
    """A torn manifest line costs only that chunk; a missing chunk file means a JSONL parse."""
    run = start_run(tmp_path)
    log_steps(run, range(1, 300))
    run.finish()
    expected = reader.load_polars(run.log_dir)
    manifest = run.log_dir / columnar.SIDECAR_DIR / columnar.MANIFEST
    manifest.write_bytes(manifest.read_bytes()[:-40])  # the last line torn (a crash mid-append)
    assert same(run.log_dir).height == expected.height
    # The first chunk's file (the torn manifest line's chunk is never read, so deleting it proves nothing).
    min((run.log_dir / columnar.SIDECAR_DIR).glob("*.metrics.arrow")).unlink()
    before = fastload.sidecar_files
    assert fastload.load_polars(run.log_dir, cache=False)["step"].to_list() == expected["step"].to_list()
    assert fastload.sidecar_files == before


def test_gzip_segment_then_plain_stream_with_sidecar(tmp_path):
    """A first process wrote gzip segments, the resumed one a plain stream with chunks."""
    first = start_run(tmp_path, compress=True)
    log_steps(first, range(1, 80))
    first.finish("failed")
    second = start_run(tmp_path, resumed_from_step=60)
    log_steps(second, range(61, 200))
    second.finish()
    assert list(second.log_dir.glob("train.*.jsonl.gz")) and (second.log_dir / columnar.SIDECAR_DIR).is_dir()
    frame = same(second.log_dir)
    steps = frame.filter(pl.col("loss").is_not_null() | pl.col("loss").is_nan())
    assert steps["step"].to_list() == list(range(1, 200))
    assert steps.filter(pl.col("step") == 70)["segment"].to_list() == [1]
