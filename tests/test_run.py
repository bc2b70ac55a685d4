"""The Run API: init, log, event, hooks, processors, thinning, finish, run.json."""

from __future__ import annotations

import math
import time
import warnings

import pytest

import flightlog
from flightlog.pipeline.processors import DropRecord
from flightlog.runfile import effective_status, read_run_file
from tests.conftest import read_stream


def metrics_of(run):
    return [r for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "metrics"]


class TestRecords:
    def test_run_start_metrics_run_end(self, make_run):
        """A run writes run_start, its metrics in order, and run_end with a summary."""
        run = make_run(run_name="r1", task_type="sft", model_name="tiny", dataset="alpaca", config={"lora_rank": 8}, max_steps=3)
        for step in (1, 2, 3):
            run.log({"loss": 3.0 - step, "learning_rate": 1e-4}, step=step, epoch=step / 10)
        run.finish()
        records = read_stream(run.log_dir / "train.jsonl")
        assert [r["type"] for r in records] == ["run_start", "metrics", "metrics", "metrics", "run_end"]
        start = records[0]
        assert start["run_name"] == "r1" and start["task_type"] == "sft" and start["model_name"] == "tiny"
        assert start["dataset"] == "alpaca" and start["config"] == {"lora_rank": 8} and start["segment"] == 0
        assert start["hardware"]["host"] and "accelerator" in start["hardware"] and start["schema_version"] == 1
        assert [r["step"] for r in records[1:4]] == [1, 2, 3] and records[2]["epoch"] == 0.2
        assert all(r["run_id"] == run.run_id for r in records)
        end = records[-1]
        assert end["status"] == "finished" and end["summary"]["last_step"] == 3
        assert end["summary"]["best"]["loss"] == {"value": 0.0, "step": 3}

    def test_auto_step_and_coercion(self, make_run):
        """Without a step the previous step + 1 is used; numpy ints are accepted; bools are not."""
        import numpy as np

        run = make_run()
        run.log({"a": 1})
        run.log({"a": 2}, step=np.int64(10))
        run.log({"a": 3})
        with pytest.raises(TypeError, match="step must be an integer"):
            run.log({"a": 4}, step=True)
        with pytest.raises(TypeError, match="step must be an integer"):
            run.log({"a": 4}, step=1.5)
        with pytest.raises(TypeError, match="takes a dict of metrics, got list"):
            run.log([("a", 1)], step=20)
        run.finish()
        assert [r["step"] for r in metrics_of(run)] == [1, 10, 11]

    def test_metrics_dict_is_copied(self, make_run):
        """Mutating the dict after log() does not change what is written."""
        run = make_run()
        logs = {"loss": 1.0}
        run.log(logs, step=1)
        logs["loss"] = 99.0
        run.finish()
        assert metrics_of(run)[0]["loss"] == 1.0

    def test_event_records_caller(self, make_run, console):
        """event() records level, message and the caller's file:line; console shows the seeds' format."""
        run = make_run()
        run.event("Starting SFT training...")  # this line's number is checked below
        line = __import__("inspect").currentframe().f_lineno - 1
        run.event("low memory", level="warning")
        with pytest.raises(ValueError, match="level 'LOUD' is not one of DEBUG, INFO"):
            run.event("x", level="LOUD")
        run.finish()
        events = [r for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "event"]
        assert events[0]["source"] == f"test_run.py:{line}" and events[0]["level"] == "INFO"
        assert events[1]["level"] == "WARNING"
        assert f"[INFO] [test_run.py:{line}] Starting SFT training..." in console.getvalue()

    def test_log_level_filters_events(self, make_run):
        """Events below log_level are not recorded."""
        run = make_run(log_level="WARNING")
        run.event("chatty", level="DEBUG")
        run.event("info", level="INFO")
        run.event("bad", level="ERROR")
        run.finish()
        events = [r["message"] for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "event"]
        assert events == ["bad"]

    def test_module_level_api(self, tmp_path, monkeypatch):
        """flightlog.log/event/finish act on the current run."""
        run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False)
        assert flightlog.current_run() is run
        flightlog.log({"loss": 1.0}, step=1)
        flightlog.event("hello")
        flightlog.finish()
        assert flightlog.current_run() is None
        records = read_stream(run.log_dir / "train.jsonl")
        assert [r["type"] for r in records] == ["run_start", "metrics", "event", "run_end"]
        assert records[2]["source"].startswith("test_run.py:")
        with pytest.raises(RuntimeError, match="no active run"):
            flightlog.log({"loss": 1.0})

    def test_context_manager_statuses(self, tmp_path):
        """A with-block ends finished, failed on an exception, interrupted on Ctrl-C."""
        for name, exc, status in (("ok", None, "finished"), ("boom", ValueError("bad batch"), "failed"), ("ctrl", KeyboardInterrupt(), "interrupted")):
            try:
                with flightlog.init(output_dir=tmp_path / name, sinks=["jsonl"], install_signal_handlers=False) as run:
                    run.log({"loss": 1.0}, step=1)
                    if exc is not None:
                        raise exc
            except (ValueError, KeyboardInterrupt):
                pass
            assert read_run_file(run.log_dir)["status"] == status
            assert read_stream(run.log_dir / "train.jsonl")[-1]["status"] == status
        failed = read_stream(tmp_path / "boom" / "logs" / "train.jsonl")
        assert any(r["type"] == "event" and "ValueError: bad batch" in r["message"] for r in failed)

    def test_log_after_finish_warns(self, make_run):
        """Records after finish are refused with one warning, and the file is unchanged."""
        run = make_run()
        run.finish()
        size = (run.log_dir / "train.jsonl").stat().st_size
        with pytest.warns(RuntimeWarning, match="is finished"):
            run.log({"loss": 1.0})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run.log({"loss": 2.0})  # only one warning
        assert (run.log_dir / "train.jsonl").stat().st_size == size

    def test_finish_status_validated(self, make_run):
        """An unknown finish status names the allowed ones."""
        run = make_run()
        with pytest.raises(ValueError, match="finished, failed, interrupted"):
            run.finish("done")

    def test_alert_and_checkpoint_records(self, make_run, console):
        """alert() and checkpoint() write protocol records and show on the console."""
        run = make_run()
        run.alert("loss_spike", "loss jumped", severity="warning", value=9.5, threshold=3.0, action="clip gradients", step=7)
        run.checkpoint("saved", "output/checkpoint-400", step=400, bytes=2_000_000, seconds=1.5)
        with pytest.raises(ValueError, match="saved, loaded, rejected"):
            run.checkpoint("lost", "x")
        run.finish()
        records = read_stream(run.log_dir / "train.jsonl")
        alert = next(r for r in records if r["type"] == "alert")
        assert alert["rule"] == "loss_spike" and alert["value"] == 9.5 and alert["threshold"] == 3.0 and alert["step"] == 7
        ckpt = next(r for r in records if r["type"] == "checkpoint")
        assert ckpt["status"] == "saved" and ckpt["path"] == "output/checkpoint-400" and ckpt["bytes"] == 2_000_000
        text = console.getvalue()
        assert "ALERT loss_spike: loss jumped (value=9.5, threshold=3) -> clip gradients" in text
        assert "checkpoint saved: output/checkpoint-400, 2.0 MB, 1.50s" in text


class TestThinning:
    def test_logging_steps(self, make_run):
        """logging_steps=10 keeps every 10th step, eval records always, events always."""
        run = make_run(logging_steps=10)
        for step in range(1, 31):
            run.log({"loss": 1.0}, step=step)
            if step == 15:
                run.log({"eval_loss": 0.5}, step=step)
                run.event("eval done")
        run.finish()
        assert [r["step"] for r in metrics_of(run)] == [10, 15, 20, 30]
        assert any(r["type"] == "event" for r in read_stream(run.log_dir / "train.jsonl"))

    def test_max_per_epoch_cap(self, make_run):
        """Without steps_per_epoch the first N kept records of each epoch are written."""
        run = make_run(max_logging_steps_per_epoch=3)
        for step in range(1, 21):
            run.log({"loss": 1.0}, step=step, epoch=(step - 1) / 10)
        run.finish()
        assert [r["step"] for r in metrics_of(run)] == [1, 2, 3, 11, 12, 13]

    def test_max_per_epoch_spread(self, make_run):
        """With steps_per_epoch known, the cap becomes an even stride."""
        run = make_run(max_logging_steps_per_epoch=4, steps_per_epoch=20)
        for step in range(1, 41):
            run.log({"loss": 1.0}, step=step, epoch=step / 20)
        run.finish()
        assert [r["step"] for r in metrics_of(run)] == [5, 10, 15, 20, 25, 30, 35, 40]


class TestHooksAndProcessors:
    def test_on_log_hook_adds_metrics(self, make_run):
        """An on_log hook (the seeds' on_log example) adds fields on the training thread."""
        run = make_run()
        seen = []

        @run.on_log
        def add_memory(metrics, step):
            seen.append(step)
            metrics["gpu_memory_mb"] = 1234.0
            return {"learning_rate": 1e-4}

        run.log({"loss": 1.0}, step=1)
        run.finish()
        record = metrics_of(run)[0]
        assert seen == [1] and record["gpu_memory_mb"] == 1234.0 and record["learning_rate"] == 1e-4

    def test_failing_hook_is_an_event(self, make_run):
        """A hook that raises leaves the record intact and an ERROR event."""
        def broken(metrics, step):
            raise KeyError("nope")

        run = make_run(on_log=[broken])
        run.log({"loss": 1.0}, step=1)
        run.finish()
        records = read_stream(run.log_dir / "train.jsonl")
        assert metrics_of(run)[0]["loss"] == 1.0
        assert any(r["type"] == "event" and "on_log hook broken failed" in r["message"] for r in records)

    def test_processors_run_on_writer(self, make_run):
        """Processors can add fields, drop records (None or DropRecord), and a raising one is skipped."""
        def tag(record):
            record["node"] = "n1"
            return record

        def drop_debug(record):
            if record.get("debug"):
                raise DropRecord
            return record

        def drop_none(record):
            return None if record.get("skip") else record

        def explode(record):
            raise RuntimeError("processor bug")

        run = make_run(processors=[tag, drop_debug, drop_none, explode])
        run.log({"loss": 1.0}, step=1)
        run.log({"loss": 2.0, "debug": True}, step=2)
        run.log({"loss": 3.0, "skip": True}, step=3)
        run.finish()
        kept = metrics_of(run)
        assert [r["step"] for r in kept] == [1] and kept[0]["node"] == "n1"
        events = [r for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "event"]
        assert any("processor explode failed: RuntimeError: processor bug" in e["message"] for e in events)

    def test_add_processor_runs_before_redaction(self, make_run):
        """A processor added later still runs before redaction (its output is redacted)."""
        run = make_run()
        run.add_processor(lambda r: {**r, "note": "token=abcdefghijklmnop"} if r["type"] == "metrics" else r)
        run.log({"loss": 1.0}, step=1)
        run.finish()
        assert metrics_of(run)[0]["note"] == "token=[REDACTED]"


class TestRunFile:
    def test_run_json_lifecycle(self, make_run):
        """run.json says running with a heartbeat, then finished with counters and summary."""
        run = make_run(heartbeat_interval=0.1, flush_interval=0.05)
        meta = read_run_file(run.log_dir)
        assert meta["status"] == "running" and meta["run_id"] == run.run_id and meta["schema_version"] == 1
        first_beat = meta["heartbeat"]
        run.log({"loss": 1.0}, step=5)
        time.sleep(0.4)
        meta = read_run_file(run.log_dir)
        assert meta["heartbeat"] > first_beat and meta["last_step"] == 5 and effective_status(meta) == "running"
        run.finish()
        meta = read_run_file(run.log_dir)
        assert meta["status"] == "finished" and meta["end_time"] and meta["records_written"] == 3
        assert meta["summary"]["last"]["loss"] == 1.0

    def test_crashed_run_recognised(self):
        """A running run whose heartbeat stopped is reported as crashed."""
        old = {"status": "running", "heartbeat": "2020-01-01T00:00:00.000Z", "heartbeat_interval": 10}
        assert effective_status(old) == "crashed"
        assert effective_status({**old, "status": "finished"}) == "finished"

    def test_second_process_continues_run(self, make_run):
        """init on the same output dir continues the run as a new segment with the same id."""
        first = make_run()
        first.log({"loss": 1.0}, step=1)
        first.finish()
        second = make_run(resumed_from_step=1)
        second.log({"loss": 0.5})
        second.finish()
        assert second.run_id == first.run_id and second.segment == 1
        starts = [r for r in read_stream(second.log_dir / "train.jsonl") if r["type"] == "run_start"]
        assert [s["segment"] for s in starts] == [0, 1] and starts[1]["resumed_from_step"] == 1
        assert [r["step"] for r in metrics_of(second)] == [1, 2]

    def test_other_run_id_in_same_dir_refused(self, make_run):
        """A different run_id cannot write into a directory that holds another run."""
        make_run().finish()
        with pytest.raises(flightlog.ConfigError, match="already holds run"):
            make_run(run_id="someone-else")


class TestValuesEndToEnd:
    def test_value_kinds(self, make_run):
        """numpy scalars, torch 0-d tensors, strings, None, nested dicts and non-finite floats."""
        import numpy as np
        import torch

        run = make_run()
        run.log(
            {
                "np_float": np.float32(0.25),
                "np_int": np.int64(7),
                "np_nan": np.float64("nan"),
                "tensor": torch.tensor(1.5),
                "grad_tensor": torch.tensor(2.5, requires_grad=True) * 1,
                "int_tensor": torch.tensor(3),
                "small_vec": torch.tensor([1.0, 2.0]),
                "stage": "warmup",
                "note": None,
                "nested": {"a": 1, "b": [1.0, float("inf")]},
                "inf": float("-inf"),
                "flag": True,
            },
            step=1,
        )
        run.finish()
        record = metrics_of(run)[0]
        assert record["np_float"] == 0.25 and record["np_int"] == 7 and math.isnan(record["np_nan"])
        assert record["tensor"] == 1.5 and record["grad_tensor"] == 2.5 and record["int_tensor"] == 3
        assert record["small_vec"] == [1.0, 2.0] and record["stage"] == "warmup" and record["note"] is None
        assert record["nested"] == {"a": 1, "b": [1.0, "Infinity"]} and record["inf"] == -math.inf and record["flag"] is True

    def test_cpu_tensor_updated_in_place_after_log_keeps_the_logged_value(self, make_run):
        """An accumulator zeroed right after logging: the record holds the value at log time."""
        import torch

        run = make_run()
        running, window = torch.zeros(()), torch.zeros(3)
        for step in range(1, 4):
            running += step
            window += step
            run.log({"loss_sum": running, "window": window}, step=step)
            running.zero_()
            window.mul_(0)
        run.finish()
        assert [(r["loss_sum"], r["window"]) for r in metrics_of(run)] == [(1.0, [1.0] * 3), (2.0, [2.0] * 3), (3.0, [3.0] * 3)]

    def test_integer_beyond_64_bits_is_written_as_a_float(self, make_run):
        """The encoder refuses such integers; the record (and the batch around it) is kept."""
        run = make_run()
        run.log({"loss": 1.0}, step=1)
        run.log({"loss": 0.5, "seed": 2**70, "offset": -(2**64)}, step=2)
        run.log({"loss": 0.25}, step=3)
        run.finish()
        records = metrics_of(run)
        assert [r["loss"] for r in records] == [1.0, 0.5, 0.25]
        assert records[1]["seed"] == float(2**70) and records[1]["offset"] == -float(2**64)
        assert read_run_file(run.log_dir)["status"] == "finished"

    def test_unsupported_value_rejected_by_key(self, make_run):
        """An unloggable value is dropped with an event naming the key; the rest of the record is kept."""
        import torch

        class Opaque:
            pass

        run = make_run()
        # (a torch object that is no tensor, torch.Size, used to raise inside log())
        run.log({"loss": 1.0, "weird": Opaque(), "big": torch.zeros(1000), "shape": torch.Size([2, 3])}, step=1)
        run.finish()
        record = metrics_of(run)[0]
        assert record["loss"] == 1.0 and "weird" not in record and "big" not in record and "shape" not in record
        messages = [r["message"] for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "event"]
        assert any("metric 'weird': values of type" in m and "Opaque" in m for m in messages)
        assert any("metric 'big': tensor of shape (1000,) is too large" in m for m in messages)
        assert any("metric 'shape': values of type torch.Size cannot be logged" in m for m in messages)
        assert run.writer.rejected_values == 3


class TestLogHandler:
    def test_std_logging_becomes_events(self, make_run):
        """logging records become events with level, file:line, logger name; exceptions included."""
        import logging

        run = make_run()
        logger = logging.getLogger("flightlog-test-handler")
        logger.setLevel(logging.DEBUG)
        handler = flightlog.LogHandler(run)
        logger.addHandler(handler)
        try:
            logger.info("Loading dataset '%s' (%d samples)...", "alpaca", 500)
            line = __import__("inspect").currentframe().f_lineno - 1
            logger.debug("too detailed")  # the handler's level is INFO
            try:
                raise ValueError("bad sample")
            except ValueError:
                logger.exception("skipping a sample")
        finally:
            logger.removeHandler(handler)
        run.finish()
        events = [r for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "event"]
        assert events[0]["message"] == "Loading dataset 'alpaca' (500 samples)..." and events[0]["source"] == f"test_run.py:{line}"
        assert events[0]["logger"] == "flightlog-test-handler" and events[0]["level"] == "INFO"
        assert len(events) == 2 and events[1]["level"] == "ERROR" and "ValueError: bad sample" in events[1]["message"]


def test_event_and_record_steps_are_integers_or_refused(make_run):
    """A step given to event()/record() is coerced like Run.log's (numpy ints, 0-d tensors);
    a step that is no integer is refused by name instead of being written as text."""
    np = pytest.importorskip("numpy")
    run = make_run()
    run.event("saved", step=np.int64(7))
    run.record("checkpoint", step=np.int32(8), status="saved", path="ckpt-8")
    with pytest.raises(TypeError, match="step must be an integer, got '9'"):
        run.event("saved", step="9")
    with pytest.raises(TypeError, match="step must be an integer"):
        run.record("checkpoint", step=1.5, status="saved", path="x")
    run.finish()
    steps = [(r["type"], r["step"]) for r in read_stream(run.log_dir / "train.jsonl") if r["type"] in ("event", "checkpoint") and "step" in r]
    assert ("event", 7) in steps and ("checkpoint", 8) in steps
    assert all(type(step) is int for _, step in steps)
