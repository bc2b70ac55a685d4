"""Sinks: JSONL (plain, gzip segments, full disk), console format, CSV; failures never stop training."""

from __future__ import annotations

import csv
import gzip
import io
import os
import time
import zlib

import pytest

import flightlog
from flightlog.sinks.base import BaseSink
from flightlog.sinks.console import ConsoleSink, format_record
from flightlog.sinks.jsonl import JsonlSink
from flightlog.store.reader import read_bytes
from tests.conftest import read_stream


class TestJsonl:
    def test_repairs_torn_tail_of_previous_process(self, tmp_path):
        """Appending after a torn last line starts on a fresh line, so only that line is lost."""
        path = tmp_path / "train.jsonl"
        path.write_bytes(b'{"type":"metrics","step":1}\n{"type":"metr')
        sink = JsonlSink(tmp_path)
        sink.write([{"type": "metrics", "step": 2}])
        sink.close()
        lines = path.read_bytes().split(b"\n")
        assert lines[0] == b'{"type":"metrics","step":1}' and lines[1] == b'{"type":"metr' and lines[2] == b'{"type":"metrics","step":2}'

    def test_gzip_segments_rotate_and_read_live(self, tmp_path):
        """Compressed segments rotate by size and are readable before the sink is closed."""
        sink = JsonlSink(tmp_path, compress=True, segment_bytes=4096)
        for i in range(3000):
            sink.write([{"type": "metrics", "step": i, "loss": 1.0 / (i + 1), "pad": "x" * (i % 50)}])
        sink.flush()
        segments = sorted(tmp_path.glob("train.*.jsonl.gz"))
        assert len(segments) >= 2
        live = b"".join(read_bytes(p) for p in segments)
        steps = [int(line.split(b'"step":')[1].split(b",")[0]) for line in live.splitlines()]
        assert steps == list(range(3000))  # everything flushed is readable while live
        with pytest.raises((EOFError, OSError)):
            gzip.decompress(segments[-1].read_bytes())  # the live segment has no trailer yet
        sink.close()
        assert gzip.decompress(segments[-1].read_bytes())  # closed: a complete gzip member

    def test_gzip_run_loads(self, make_run):
        """A run with compress=True loads like a plain one."""
        run = make_run(compress=True)
        for step in range(1, 101):
            run.log({"loss": 1.0 / step}, step=step)
        run.finish()
        assert not (run.log_dir / "train.jsonl").exists()
        frame = flightlog.load(run.log_dir)
        assert frame["step"].tolist() == list(range(1, 101))

    def test_full_disk_is_retried_and_nothing_accepted_is_lost(self, tmp_path):
        """ENOSPC (a real one, from /dev/full) keeps the bytes; once writable again they all land."""
        target = tmp_path / "train.jsonl"
        os.symlink("/dev/full", target)
        sink = JsonlSink(tmp_path)
        with pytest.raises(OSError) as info:
            sink.write([{"type": "metrics", "step": 1}])
        assert info.value.errno == 28  # ENOSPC
        with pytest.raises(OSError):
            sink.write([{"type": "metrics", "step": 2}])
        # The disk "recovers": point the sink at a real file again.
        os.close(sink._fd)
        target.unlink()
        sink._fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        sink._good_offset = 0
        sink.write([{"type": "metrics", "step": 3}])
        sink.close()
        steps = [r["step"] for r in read_stream(target)]
        assert steps == [1, 2, 3]


class TestFailuresNeverStopTraining:
    def test_raising_sink(self, make_run, console):
        """A sink that raises on every write is counted and reported; the other sinks get everything."""
        class Broken(BaseSink):
            name = "broken"

            def write(self, batch):
                raise RuntimeError("endpoint down")

        run = make_run(sinks=["jsonl", Broken(), ConsoleSink(console)], flush_interval=0.05)
        for step in range(1, 201):
            run.log({"loss": 1.0}, step=step)
        run.finish()
        records = read_stream(run.log_dir / "train.jsonl")
        assert [r["step"] for r in records if r["type"] == "metrics"] == list(range(1, 201))
        failures = [r for r in records if r["type"] == "event" and "sink 'broken' failed" in r["message"]]
        assert len(failures) == 1 and failures[0]["level"] == "ERROR"  # rate-limited: one event
        assert run.writer.sink_failures["broken"] >= 2
        assert "sink 'broken' failed to write (RuntimeError: endpoint down)" in console.getvalue()

    def test_full_disk_during_training(self, tmp_path):
        """With train.jsonl on a full device, the training loop runs to the end and the failure is recorded."""
        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        os.symlink("/dev/full", log_dir / "train.jsonl")
        console = io.StringIO()
        run = flightlog.init(output_dir=tmp_path, sinks=["jsonl", "csv", ConsoleSink(console)], install_signal_handlers=False, flush_interval=0.05)
        start = time.perf_counter()
        for step in range(1, 501):
            run.log({"loss": 1.0}, step=step)
        loop_time = time.perf_counter() - start
        run.finish()
        assert loop_time < 2.0
        assert run.writer.sink_failures["jsonl"] >= 1
        assert "No space left on device" in console.getvalue()
        rows = list(csv.DictReader(open(log_dir / "metrics.csv")))
        assert len(rows) == 500  # the other sinks kept everything


class TestConsole:
    def test_seed_metrics_line(self):
        """The metrics line matches the seeds' format exactly."""
        record = {
            "type": "metrics", "step": 45, "epoch": 0.09, "loss": 2.1423, "learning_rate": 9.98e-05,
            "grad_norm": 1.234, "gpu_memory_mb": 14.2 * 1024, "gpu_memory_total_mb": 24.0 * 1024, "step_time_s": 1.82,
        }
        assert format_record(record, 500) == "Step 45/500 | epoch 0.09 | loss 2.1423 | lr 9.98e-05 | grad_norm 1.234 | gpu_mem 14.2GB/24.0GB | time 1.82s/step"

    def test_user_metrics_follow(self):
        """User metrics follow the seed fields; nested values are not printed."""
        line = format_record({"type": "metrics", "step": 3, "loss": 1.0, "bleu": 24.32, "cfg": {"a": 1}}, None)
        assert line == "Step 3 | loss 1.0000 | bleu 24.32"

    def test_event_line(self):
        """Events use the seeds' logging layout in local time."""
        from datetime import datetime

        ts = "2024-09-12T06:22:03.187Z"
        local = datetime.fromtimestamp(flightlog.protocol.parse_timestamp(ts)).strftime("%Y-%m-%d %H:%M:%S")
        line = format_record({"type": "event", "timestamp": ts, "level": "INFO", "source": "sft.py:123", "message": "Starting SFT training..."})
        assert line == f"[{local},187] [INFO] [sft.py:123] Starting SFT training..."


class TestCsv:
    def test_widens_when_new_metric_appears(self, make_run):
        """metrics.csv gains eval columns at the first eval, keeping earlier rows."""
        run = make_run(sinks=["csv"], flush_interval=0.05)
        run.log({"loss": 2.0}, step=1)
        run.flush()
        run.log({"loss": 1.5, "eval_loss": 1.7}, step=2)
        run.log({"loss": float("nan")}, step=3)
        run.finish()
        rows = list(csv.DictReader(open(run.log_dir / "metrics.csv")))
        assert list(rows[0])[:3] == ["step", "epoch", "timestamp"] or list(rows[0])[:2] == ["step", "timestamp"]
        assert [r["loss"] for r in rows] == ["2.0", "1.5", "NaN"]
        assert [r["eval_loss"] for r in rows] == ["", "1.7", ""]

    def test_gzip_csv(self, make_run):
        """csv_compress writes metrics.csv.gz that gzip and pandas read."""
        import pandas as pd

        run = make_run(sinks=["csv"], csv_compress=True)
        for step in range(1, 11):
            run.log({"loss": 1.0 / step}, step=step)
        run.finish()
        frame = pd.read_csv(run.log_dir / "metrics.csv.gz")
        assert frame["step"].tolist() == list(range(1, 11))

    def test_unknown_sink_name(self, tmp_path):
        """An unknown sink name fails at init and lists the known ones."""
        with pytest.raises(ValueError, match="unknown sink 'tensorbored'; known sinks: .*jsonl"):
            flightlog.init(output_dir=tmp_path, sinks=["tensorbored"], install_signal_handlers=False)
