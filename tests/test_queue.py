"""The bounded queue: block (warn once) or drop oldest (counted); never silent."""

from __future__ import annotations

import threading
import time

import pytest

from flightlog.pipeline.queue import RecordQueue
from tests.conftest import read_stream


class TestQueue:
    def test_block_waits_for_writer_and_warns_once(self):
        """A full blocking queue makes put wait until the writer drains, with one warning."""
        q = RecordQueue(2, "block")
        q.put(1)
        q.put(2)

        def drain_later():
            time.sleep(0.2)
            q.drain(10)

        threading.Thread(target=drain_later).start()
        with pytest.warns(RuntimeWarning, match="record queue is full"):
            start = time.perf_counter()
            q.put(3)
        assert time.perf_counter() - start >= 0.15 and q.drain(10) == [3]
        q.put(4)
        q.put(5)
        threading.Thread(target=drain_later).start()
        q.put(6)  # no second warning (pytest would fail on an unexpected one under -W error)
        assert q.blocked_seconds > 0.3

    def test_drop_oldest_counts(self):
        """drop_oldest keeps the newest records and counts what it dropped."""
        q = RecordQueue(3, "drop_oldest")
        for i in range(10):
            q.put(i)
        assert q.drain(10) == [7, 8, 9] and q.dropped == 7

    def test_bad_policy(self):
        """An unknown policy is refused by name."""
        with pytest.raises(ValueError, match="on_full must be 'block' or 'drop_oldest'"):
            RecordQueue(3, "drop_newest")


class TestBackpressureInRun:
    def test_slow_sink_blocks_but_loses_nothing(self, make_run):
        """With a tiny queue and a slow sink, every record still reaches disk (default policy)."""
        from flightlog.sinks.base import BaseSink

        class Slow(BaseSink):
            name = "slow"

            def write(self, batch):
                time.sleep(0.002)

        run = make_run(queue_size=8, sinks=["jsonl", Slow()])
        with pytest.warns(RuntimeWarning, match="queue is full"):
            for step in range(1, 301):
                run.log({"loss": 1.0}, step=step)
        run.finish()
        steps = [r["step"] for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "metrics"]
        assert steps == list(range(1, 301)) and run.dropped == 0

    def test_drop_oldest_in_run_is_reported(self, make_run):
        """drop_oldest never blocks; the count lands in run.json."""
        from flightlog.runfile import read_run_file
        from flightlog.sinks.base import BaseSink

        class Slow(BaseSink):
            name = "slow"

            def write(self, batch):
                time.sleep(0.01)

        run = make_run(queue_size=4, on_full="drop_oldest", sinks=["jsonl", Slow()])
        for step in range(1, 2001):
            run.log({"loss": 1.0}, step=step)
        run.finish()
        assert run.dropped > 0
        assert read_run_file(run.log_dir)["records_dropped"] == run.dropped
