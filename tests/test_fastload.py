"""The fast loader gives the careful reader's rows: NaN, torn lines, resumes, gzip, cache."""

from __future__ import annotations

import gzip
import math

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import flightlog
from flightlog.protocol import RECORD_TYPES, encode, make_finite
from flightlog.store import fastload, reader


@pytest.fixture(autouse=True)
def small_cache(home, monkeypatch):
    """Cache every stream, however small (FLIGHTLOG_HOME comes from conftest's ``home``)."""
    monkeypatch.setattr(fastload, "CACHE_MIN_BYTES", 1)


def metric(step, segment_time=0, **fields):
    return {"type": "metrics", "timestamp": f"2026-01-01T00:{segment_time:02d}:{step % 60:02d}.000Z", "run_id": "r", "step": step, **fields}


def start(segment, resumed=None, minute=0):
    return {"type": "run_start", "timestamp": f"2026-01-01T00:{minute:02d}:00.000Z", "run_id": "r", "segment": segment, "resumed_from_step": resumed, "config": {"lora_rank": 8}}


def write(path, records, tail=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(encode(make_finite(r)) for r in records) + tail)


def same(path, types=("metrics",), fast=True, **kw):
    """fastload (cold and cached) returns the reader's rows and values, without falling back."""
    expected = reader.load_polars(path, types=types, **kw)
    for _ in range(2):  # the second load comes from the cache
        before = fastload.fallbacks
        got = fastload.load_polars(path, types=types, **kw)
        assert fastload.fallbacks == before or not fast
        assert sorted(got["type"].unique()) == sorted(expected["type"].unique()) and got.height == expected.height
        for kind in expected["type"].unique():  # per type: the reader orders ties across types by type, fastload by file
            want = expected.filter(pl.col("type") == kind)
            have = got.filter(pl.col("type") == kind)
            keep = sorted(c for c in want.columns if want.get_column(c).null_count() < want.height)
            order = [c for c in ("step", "timestamp", "rule", "message") if c in keep]  # the reader orders by time
            assert_frame_equal(have.select(keep).sort(order, maintain_order=True), want.select(keep).sort(order, maintain_order=True), check_dtypes=False)
    return got


def test_real_run_all_types(tmp_path):
    """A run written by flightlog.init loads the same, whichever record types are asked for."""
    run = flightlog.init(output_dir=tmp_path / "out", sinks=["jsonl"], install_signal_handlers=False, config={"lora_rank": 8})
    for step in range(1, 301):
        run.log({"loss": 1.0 / step, "grad_norm": math.nan if step == 150 else 1.0, "stage": "warmup" if step < 10 else "stable"}, step=step)
    run.event("half way", level="WARNING", step=150)
    run.alert("loss_spike", "loss jumped", value=math.inf, threshold=3.0, step=151)
    run.finish()
    frame = same(run.log_dir)
    assert frame.height == 300 and math.isnan(frame.filter(pl.col("step") == 150)["grad_norm"][0])
    same(run.log_dir, types=sorted(RECORD_TYPES))
    alerts = same(run.log_dir, types=("alert", "event"))
    mine = alerts.filter(pl.col("rule") == "loss_spike")  # the diagnosis rules add their own alert on the NaN
    assert "event" in alerts["type"].to_list() and mine["value"].to_list() == [math.inf]


def test_superseded_records_hidden(tmp_path):
    """Records a resume made obsolete are hidden (or kept with include_superseded)."""
    path = tmp_path / "logs" / "train.jsonl"
    write(path, [start(0), *[metric(s, loss=1.0) for s in range(1, 11)], start(1, resumed=5, minute=1), *[metric(s, 1, loss=2.0) for s in range(6, 13)]])
    frame = same(path.parent)
    assert frame["step"].to_list() == [1, 2, 3, 4, 5, *range(6, 13)]
    assert same(path.parent, include_superseded=True).height == 17


def test_torn_last_line_and_growth(tmp_path):
    """A torn last line is skipped with a warning; lines appended later are read (cache + tail)."""
    path = tmp_path / "logs" / "train.jsonl"
    sixth = encode(metric(6, loss=6.0))
    write(path, [start(0), *[metric(s, loss=float(s)) for s in range(1, 6)]], tail=sixth[:25])
    with pytest.warns(reader.StreamWarning, match="torn last line"):
        assert fastload.load_polars(path.parent)["step"].to_list() == [1, 2, 3, 4, 5]
    with open(path, "ab") as fh:  # the writer finishes the line and goes on
        fh.write(sixth[25:] + b"".join(encode(metric(s, loss=float(s))) for s in range(7, 9)))
    assert fastload.load_polars(path.parent)["step"].to_list() == list(range(1, 9))
    same(path.parent)


def test_rewritten_file_invalidates_cache(tmp_path):
    """A stream replaced by another file of the same size is parsed again, not served stale."""
    path = tmp_path / "logs" / "train.jsonl"
    write(path, [start(0), *[metric(s, loss=1.0) for s in range(1, 6)]])
    assert fastload.load_polars(path.parent)["loss"].to_list() == [1.0] * 5
    write(path, [start(0), *[metric(s, loss=2.0) for s in range(1, 6)]])
    assert fastload.load_polars(path.parent)["loss"].to_list() == [2.0] * 5


def test_gzip_segments_and_corrupt_lines(tmp_path):
    """gzip segments load; a corrupt line in the middle falls back to the careful reader."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.00000.jsonl.gz").write_bytes(gzip.compress(b"".join(encode(r) for r in [start(0), *[metric(s, loss=1.0) for s in range(1, 4)]])))
    write(logs / "train.jsonl", [metric(s, loss=2.0) for s in range(4, 7)])
    assert same(logs)["step"].to_list() == [1, 2, 3, 4, 5, 6]
    write(logs / "train.jsonl", [metric(4, loss=2.0)], tail=b"{not json\n" + encode(metric(5, loss=2.0)))
    before = fastload.fallbacks
    with pytest.warns(reader.StreamWarning, match="unreadable"):
        assert fastload.load_polars(logs)["step"].to_list() == [1, 2, 3, 4, 5]
    assert fastload.fallbacks == before + 1


def test_type_changing_field(tmp_path):
    """A field that is a number in one record and text in another still loads."""
    path = tmp_path / "logs" / "train.jsonl"
    write(path, [start(0), metric(1, note=1.5), metric(2, note="n/a")])
    assert same(path.parent).height == 2
