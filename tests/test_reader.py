"""Reading runs back: torn and corrupt lines, gzip, non-finite values, superseded records."""

from __future__ import annotations

import math

import pytest

import flightlog
from flightlog.protocol import encode, make_finite
from flightlog.store.reader import StreamWarning, load_polars, read_records, resolve_run_dir


def write_lines(path, records, tail=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(encode(make_finite(r)) for r in records) + tail)


def metric(step, **fields):
    return {"type": "metrics", "timestamp": f"2026-01-01T00:00:{step % 60:02d}.000Z", "run_id": "r", "step": step, **fields}


class TestLoad:
    def test_finds_logs_below_output_dir(self, make_run):
        """load() accepts a Run, its log dir, the output dir or the file itself."""
        run = make_run()
        run.log({"loss": 1.0}, step=1)
        run.finish()
        for target in (run, run.log_dir, run.output_dir, run.log_dir / "train.jsonl"):
            assert flightlog.load(target)["loss"].tolist() == [1.0]

    def test_missing_path_errors(self, tmp_path):
        """A path with no run says what was expected."""
        with pytest.raises(FileNotFoundError, match="does not exist"):
            resolve_run_dir(tmp_path / "nope")
        with pytest.raises(FileNotFoundError, match="expected train.jsonl"):
            resolve_run_dir(tmp_path)

    def test_torn_last_line_skipped_with_warning(self, tmp_path):
        """A torn last line is skipped with a StreamWarning; everything before it loads."""
        path = tmp_path / "logs" / "train.jsonl"
        write_lines(path, [metric(1, loss=1.0), metric(2, loss=0.5)], tail=b'{"type":"metrics","step":3,"lo')
        with pytest.warns(StreamWarning, match="torn last line"):
            frame = flightlog.load(tmp_path)
        assert frame["step"].tolist() == [1, 2]

    def test_complete_last_line_without_newline_kept(self, tmp_path):
        """A last line that is whole but lacks its newline is still a record."""
        path = tmp_path / "train.jsonl"
        write_lines(path, [metric(1, loss=1.0)], tail=b'{"type":"metrics","step":2,"loss":0.5}')
        assert flightlog.load(path)["step"].tolist() == [1, 2]

    def test_corrupt_middle_line_skipped(self, tmp_path):
        """A garbage line in the middle is skipped and counted; neighbours survive."""
        path = tmp_path / "train.jsonl"
        path.write_bytes(encode(metric(1, loss=1.0)) + b'{"type":"metrics","step":2,"loss":\n' + encode(metric(3, loss=0.3)) + b"\x00\x01garbage\n")
        with pytest.warns(StreamWarning, match="unreadable"):
            frame = flightlog.load(path)
        assert frame["step"].tolist() == [1, 3]

    def test_non_finite_and_mixed_columns(self, tmp_path):
        """NaN/Infinity strings come back as floats; real string columns stay strings."""
        path = tmp_path / "train.jsonl"
        write_lines(path, [metric(1, loss=1.0, stage="warmup"), metric(2, loss=math.nan, stage="stable"), metric(3, loss=math.inf, stage="stable")])
        frame = flightlog.load(path)
        assert frame["loss"].dtype.kind == "f" and math.isnan(frame["loss"][1]) and frame["loss"][2] == math.inf
        assert frame["stage"].tolist() == ["warmup", "stable", "stable"]
        records = list(read_records(path))
        assert math.isnan(records[1]["loss"])

    def test_types_and_all_records(self, make_run):
        """types=None loads every record type; a string selects one."""
        run = make_run()
        run.log({"loss": 1.0}, step=1)
        run.event("hi")
        run.finish()
        assert set(flightlog.load(run, types=None)["type"]) == {"run_start", "metrics", "event", "run_end"}
        assert flightlog.load(run, types="event")["message"].tolist() == ["hi"]


class TestSupersession:
    def test_resumed_run_loads_as_one_run_without_duplicates(self, make_run):
        """Steps a crash made obsolete are hidden; they stay on disk and can be shown."""
        first = make_run()
        for step in range(1, 11):
            first.log({"loss": 10.0 - step}, step=step)
        first.finish("failed")
        second = make_run(resumed_from_step=6)
        for step in range(7, 13):
            second.log({"loss": 100.0 + step}, step=step)
        second.finish()
        frame = flightlog.load(second)
        assert frame["step"].tolist() == list(range(1, 13))
        assert frame.set_index("step").loc[8, "loss"] == 108.0 and frame.set_index("step").loc[5, "loss"] == 5.0
        everything = flightlog.load(second, include_superseded=True)
        assert len(everything) == 16
        records = [r for r in read_records(second.log_dir) if r["type"] == "metrics"]
        assert [r["step"] for r in records] == list(range(1, 13))

    def test_polars_frame_has_segments(self, make_run):
        """The Polars frame says which process segment wrote each row."""
        first = make_run()
        first.log({"loss": 1.0}, step=1)
        first.finish()
        second = make_run(resumed_from_step=1)
        second.log({"loss": 0.5}, step=2)
        second.finish()
        frame = load_polars(second.log_dir)
        assert frame["segment"].to_list() == [0, 1]
