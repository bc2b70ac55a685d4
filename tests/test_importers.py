"""Importers: ms-swift logging.jsonl, HF trainer_state.json, TensorBoard events, text logs.

Each format is read from files written the way the tool writes them (TensorBoard files by
TensorBoard's own writer through torch's SummaryWriter; HF files by a real Trainer in
test_watch.py), including files still being written, torn lines, duplicated and missing
steps and wrong types: those are counted skips, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from flightlog.store.importers import detect_formats, open_importer
from flightlog.store.importers.hf import TrainerStateImporter
from flightlog.store.importers.swift import SwiftImporter
from flightlog.store.importers.tensorboard import TensorBoardImporter, tag_name
from flightlog.store.importers.text import ConsoleParser, TextImporter
from tests.test_watch import hf_run  # noqa: F401  (a real HF Trainer run, shared)

NEW = [  # ms-swift since 2026: train_speed(s/it)
    {"loss": 2.1423, "grad_norm": 1.234, "learning_rate": 9.98e-05, "memory(GiB)": 14.2, "train_speed(s/it)": 1.82,
     "epoch": 0.09, "global_step/max_steps": "45/500", "percentage": "9.00%", "elapsed_time": "1m 22s", "remaining_time": "1h 2m 3s"},
    {"loss": 2.0, "grad_norm": 1.1, "learning_rate": 9.9e-05, "memory(GiB)": 14.3, "train_speed(s/it)": 1.8,
     "epoch": 0.1, "global_step/max_steps": "50/500", "percentage": "10.00%", "elapsed_time": "1m 31s", "remaining_time": "13m 40s"},
    {"eval_loss": 1.9, "eval_acc": 0.61, "eval_runtime": 3.2, "epoch": 0.1, "global_step/max_steps": "50/500"},
    {"train_runtime": 910.1, "train_samples_per_second": 4.4, "train_steps_per_second": 0.55, "train_loss": 1.7,
     "epoch": 1.0, "global_step/max_steps": "500/500", "memory(GiB)": 15.0},
]
OLD = [  # older ms-swift: train_speed(iter/s); the oldest files have an integer global_step
    {"loss": 3.0, "acc": 0.4, "learning_rate": 1e-4, "memory(GiB)": 10.0, "train_speed(iter/s)": 0.5, "epoch": 0.01, "global_step/max_steps": "5/100",
     "percentage": "5.00%", "elapsed_time": "10s", "remaining_time": "3m 10s"},
    {"loss": 2.5, "acc": 0.45, "learning_rate": 1e-4, "epoch": 0.02, "global_step": 10},
]


def write_lines(path: Path, objs: list, tail: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(o) for o in objs) + tail)


def metrics(records: list[dict]) -> list[dict]:
    return [r for r in records if r["type"] == "metrics"]


def fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


class TestSwift:
    def test_new_field_set(self, tmp_path: Path) -> None:
        """The 2026 field set maps onto protocol names and units; eval and summary lines are kept, the summary ends the run."""
        run = tmp_path / "v0-20260101-120000"
        write_lines(run / "logging.jsonl", NEW)
        (run / "args.json").write_text(json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct", "dataset": ["alpaca-zh", "alpaca-en"], "lora_rank": 8, "rlhf_type": None, "max_steps": 500}))
        before = fingerprint(run / "logging.jsonl")
        records = list(SwiftImporter(run / "logging.jsonl").records())
        start = records[0]
        assert start["type"] == "run_start" and start["model_name"] == "Qwen/Qwen2.5-7B-Instruct"
        assert start["dataset"] == "alpaca-zh,alpaca-en" and start["task_type"] == "sft" and start["max_steps"] == 500
        assert start["config"]["lora_rank"] == 8
        m = metrics(records)
        first = m[0]
        assert first["step"] == 45 and first["epoch"] == 0.09 and first["loss"] == 2.1423
        assert first["gpu_memory_mb"] == pytest.approx(14.2 * 1024)
        assert first["step_time_s"] == 1.82 and first["train_speed_s_per_it"] == 1.82
        assert first["elapsed_time_s"] == 82 and first["remaining_time_s"] == 3723
        assert m[2]["step"] == 50 and m[2]["eval_loss"] == 1.9 and "loss" not in m[2]
        assert m[3]["step"] == 500 and m[3]["train_runtime"] == 910.1
        assert records[-1]["type"] == "run_end" and records[-1]["status"] == "finished"
        assert records[-1]["summary"]["train_loss"] == 1.7
        assert fingerprint(run / "logging.jsonl") == before

    def test_old_field_set(self, tmp_path: Path) -> None:
        """train_speed(iter/s) becomes step_time_s = 1/speed; an integer global_step is the step."""
        write_lines(tmp_path / "logging.jsonl", OLD)
        imp = SwiftImporter(tmp_path)
        m = metrics(list(imp.records()))
        assert [r["step"] for r in m] == [5, 10]
        assert m[0]["step_time_s"] == 2.0 and m[0]["train_speed_iter_per_s"] == 0.5 and m[0]["acc"] == 0.4
        assert imp.mapper.max_steps == 100 and not imp.ended

    def test_versioned_folders(self, tmp_path: Path) -> None:
        """detect_formats picks the newest v{N}-{timestamp} folder, or every one as its own run."""
        for name in ("v0-20260101-120000", "v1-20260102-090000", "v10-20260103-080000"):
            write_lines(tmp_path / name / "logging.jsonl", OLD)
        (tmp_path / "v2-notadate").mkdir()
        newest = detect_formats(tmp_path)
        assert [(d.format, d.path.parent.name) for d in newest] == [("ms-swift", "v10-20260103-080000")]
        every = detect_formats(tmp_path, all_versions=True)
        assert [d.path.parent.name for d in every] == ["v0-20260101-120000", "v1-20260102-090000", "v10-20260103-080000"]

    def test_run_info_line(self, tmp_path: Path) -> None:
        """The run-info line at the end gives checkpoint records (best and last) and ends the run."""
        info = {"last_model_checkpoint": "/o/v0/checkpoint-500", "best_model_checkpoint": "/o/v0/checkpoint-400", "best_metric": 1.61, "global_step": 500, "log_history": [{"loss": 1}]}
        write_lines(tmp_path / "logging.jsonl", OLD[:1] + [info])
        records = list(SwiftImporter(tmp_path).records())
        cps = [r for r in records if r["type"] == "checkpoint"]
        assert {(c["step"], "best" in c) for c in cps} == {(500, False), (400, True)}
        assert records[-1]["type"] == "run_end" and records[-1]["summary"]["best_metric"] == 1.61

    def test_torn_last_line_and_bad_input(self, tmp_path: Path) -> None:
        """Torn, invalid, non-object, step-less and wrongly typed input is counted and skipped; the rest is kept."""
        path = tmp_path / "logging.jsonl"
        lines = [
            json.dumps(NEW[0]),
            "not json at all",
            "[1, 2, 3]",
            json.dumps({"loss": 1.0, "epoch": 0.1}),  # no step before any step: skipped
            json.dumps({**NEW[1], "loss": "abc", "grad_norm": None, "learning_rate": True}),
            json.dumps({"loss": 1.0, "global_step/max_steps": "x/500"}),
            json.dumps({"loss": 1.0, "global_step/max_steps": 7}),
            '{"loss": NaN, "global_step/max_steps": "55/500"}',  # Python's json writes NaN bare
            '{"loss": 1.9, "global_step/max_steps": "60/5',  # torn
        ]
        path.write_text("\n".join(lines[:3] + [lines[3]] + lines[4:]))
        imp = SwiftImporter(path)
        records = list(imp.records())
        m = metrics(records)
        assert [r["step"] for r in m] == [45, 50, 55]
        assert "loss" not in m[1] and "learning_rate" not in m[1] and m[1]["grad_norm"] if "grad_norm" in m[1] else True
        assert m[2]["loss"] != m[2]["loss"]  # NaN survives as a float NaN
        assert imp.stats.skipped == {"invalid JSON": 1, "not a JSON object": 1, "missing step": 1, "unreadable step": 2, "torn last line": 1}
        assert imp.stats.dropped_values == {"loss": 1, "learning_rate": 1}
        warnings = [r["message"] for r in records if r["type"] == "event"]
        assert any("logging.jsonl:2" in w and "invalid JSON" in w for w in warnings)

    def test_duplicates_and_restart(self, tmp_path: Path) -> None:
        """An exact duplicate line is a counted skip; a step that comes again with new values is a restart segment."""
        a = {"loss": 2.0, "global_step/max_steps": "10/100"}
        b = {"loss": 1.9, "global_step/max_steps": "20/100"}
        b2 = {"loss": 1.95, "global_step/max_steps": "20/100"}
        c = {"loss": 1.5, "global_step/max_steps": "40/100"}  # steps 21..39 missing: kept as a gap
        write_lines(tmp_path / "logging.jsonl", [a, b, b, b2, c])
        imp = SwiftImporter(tmp_path)
        records = list(imp.records())
        assert imp.stats.skipped["duplicate record"] == 1
        restart = [r for r in records[1:] if r["type"] == "run_start"]
        assert restart == [{"type": "run_start", "timestamp": restart[0]["timestamp"], "segment": 1, "resumed_from_step": 19}]
        assert [(r["step"], r["loss"]) for r in metrics(records)] == [(10, 2.0), (20, 1.9), (20, 1.95), (40, 1.5)]

    def test_follow_growing_file(self, tmp_path: Path) -> None:
        """follow() yields lines as they are appended, holds a half-written line until its newline, and ends at the summary."""
        path = tmp_path / "logging.jsonl"
        path.write_text("")
        got: list[dict] = []
        imp = SwiftImporter(path)
        thread = threading.Thread(target=lambda: got.extend(imp.follow(poll_interval=0.02, idle_timeout=10)))
        thread.start()
        with open(path, "a") as fh:
            for i, obj in enumerate(NEW):
                line = json.dumps(obj) + "\n"
                fh.write(line[:20])
                fh.flush()
                time.sleep(0.05)  # the reader sees a partial line here
                fh.write(line[20:])
                fh.flush()
                time.sleep(0.03)
        thread.join(10)
        assert not thread.is_alive()
        assert [r["step"] for r in metrics(got)] == [45, 50, 50, 500]
        assert got[-1]["type"] == "run_end" and imp.stats.skipped == {}

    def test_truncation_and_rotation(self, tmp_path: Path) -> None:
        """A truncated file is read again from the start; a rotated one (new inode) too."""
        path = tmp_path / "logging.jsonl"
        write_lines(path, OLD[:1])
        imp = SwiftImporter(path)
        assert [r["step"] for r in metrics(imp._poll())] == [5]
        path.write_text(json.dumps({"loss": 9.0, "global_step/max_steps": "1/100"}) + "\n")
        assert [r["step"] for r in metrics(imp._poll())] == [1] and imp.tail.truncations == 1
        os.rename(path, tmp_path / "old.jsonl")
        write_lines(path, [{"loss": 8.0, "global_step/max_steps": "2/100"}, {"loss": 7.0, "global_step/max_steps": "3/100"}])
        assert [r["step"] for r in metrics(imp._poll())] == [2, 3] and imp.tail.rotations == 1


class TestTrainerState:
    def state(self) -> dict:
        return {
            "global_step": 20, "max_steps": 20, "logging_steps": 5, "eval_steps": 10, "epoch": 1.0,
            "best_metric": 1.2, "best_model_checkpoint": "out/checkpoint-10",
            "log_history": [
                {"loss": 2.0, "grad_norm": 1.5, "learning_rate": 5e-5, "epoch": 0.25, "step": 5},
                {"loss": 1.8, "learning_rate": 4e-5, "epoch": 0.5, "step": 10},
                {"eval_loss": 1.2, "eval_runtime": 0.3, "epoch": 0.5, "step": 10},
                {"loss": "oops", "epoch": 0.75, "step": 15},
                {"loss": 1.5, "epoch": 0.8},
                "junk",
                {"loss": 1.4, "epoch": 1.0, "step": 20},
                {"train_runtime": 12.5, "train_loss": 1.7, "total_flos": 1e9, "epoch": 1.0, "step": 20},
            ],
        }

    def test_log_history_and_best(self, tmp_path: Path) -> None:
        """log_history entries become metrics (eval separately), the best checkpoint a checkpoint record; bad entries are counted."""
        (tmp_path / "checkpoint-10").mkdir()
        partial = self.state()
        partial["log_history"] = partial["log_history"][:3]
        partial["global_step"] = 10
        (tmp_path / "checkpoint-10" / "trainer_state.json").write_text(json.dumps(partial))
        (tmp_path / "trainer_state.json").write_text(json.dumps(self.state()))
        found = detect_formats(tmp_path)
        assert [(d.format, d.live) for d in found] == [("hf", False)]
        imp = found[0].open()
        records = list(imp.records())
        assert records[0]["max_steps"] == 20 and records[0]["config"]["logging_steps"] == 5
        m = metrics(records)
        assert [(r["step"], sorted(k for k in r if k not in ("type", "timestamp", "step", "epoch"))) for r in m] == [
            (5, ["grad_norm", "learning_rate", "loss"]), (10, ["learning_rate", "loss"]), (10, ["eval_loss", "eval_runtime"]),
            (20, ["loss"]), (20, ["total_flos", "train_loss", "train_runtime"]),
        ]
        cp = [r for r in records if r["type"] == "checkpoint"]
        assert cp[0]["path"] == "out/checkpoint-10" and cp[0]["step"] == 10 and cp[0]["best_metric"] == 1.2
        assert records[-1]["type"] == "run_end" and records[-1]["summary"]["best_model_checkpoint"] == "out/checkpoint-10"
        assert imp.stats.skipped == {"missing or bad step": 1, "log entry is not an object": 1}
        assert imp.stats.dropped_values == {"loss": 1}

    def test_follow_new_checkpoints(self, tmp_path: Path) -> None:
        """Following re-reads the newest copy when a checkpoint appears, emits only new entries, retries a half-written file."""
        imp = TrainerStateImporter(tmp_path)
        first = self.state()
        first["log_history"] = first["log_history"][:2]
        first["global_step"] = 10
        (tmp_path / "checkpoint-10").mkdir()
        (tmp_path / "checkpoint-10" / "trainer_state.json").write_text(json.dumps(first))
        imp._start()
        assert [r["step"] for r in metrics(imp._poll())] == [5, 10]
        (tmp_path / "checkpoint-20").mkdir()
        text = json.dumps(self.state())
        (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(text[: len(text) // 2])
        time.sleep(0.01)
        assert imp._take(imp._poll())[0]["type"] == "event"  # "not valid JSON yet; will retry"
        (tmp_path / "checkpoint-20" / "trainer_state.json").write_text(text)
        steps = [(r["type"], r.get("step")) for r in imp._poll()]
        assert ("metrics", 5) not in steps and ("metrics", 20) in steps and steps[-1] == ("run_end", None)

    def test_real_trainer_files(self, hf_run: dict) -> None:
        """Files written by a real HF Trainer: every logged step of the Trainer's own log_history, eval and best included."""
        records = list(open_importer("hf", hf_run["output_dir"] / "checkpoint-12" / "trainer_state.json").records())
        truth = [h for h in hf_run["truth"]["log_history"] if "train_runtime" not in h]  # saved before the summary
        m = metrics(records)
        assert [r["step"] for r in m] == [h["step"] for h in truth]
        assert [r.get("loss") for r in m] == [h.get("loss") for h in truth]
        assert [r.get("eval_loss") for r in m if "eval_loss" in r] == [h["eval_loss"] for h in truth if "eval_loss" in h]
        assert any(r["type"] == "checkpoint" and r["path"].endswith("checkpoint-12") for r in records)


class TestTensorBoard:
    def test_summary_writer_file(self, tmp_path: Path) -> None:
        """Scalars written by TensorBoard's writer become one record per step; eval tags a separate record."""
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(tmp_path)) as w:
            for step in (1, 2, 3):
                w.add_scalar("train/loss", 1.0 / step, step)
                w.add_scalar("train/learning_rate", 1e-4, step)
                w.add_scalar("train/epoch", step / 3, step)
                w.add_scalar("train/memory(GiB)", 2.0, step)
            w.add_scalar("eval/loss", 0.7, 3)
            w.add_histogram("weights", np.array([1.0, 2.0]), 3)
            w.add_scalar("train/train_runtime", 12.0, 3)
        found = detect_formats(tmp_path)
        assert [d.format for d in found] == ["tensorboard"]
        records = list(found[0].open().records())
        m = metrics(records)
        assert [(r["step"], r.get("loss")) for r in m if "loss" in r] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
        assert m[0]["epoch"] == pytest.approx(1 / 3) and m[0]["gpu_memory_mb"] == 2048.0
        assert [r["eval_loss"] for r in m if "eval_loss" in r] == [pytest.approx(0.7)]
        assert records[-1]["type"] == "run_end" and records[-1]["summary"]["train_runtime"] == 12.0

    def test_live_file_and_torn_record(self, tmp_path: Path) -> None:
        """A file still being written is followed; a torn last record waits for the rest instead of failing."""
        from torch.utils.tensorboard import SummaryWriter

        w = SummaryWriter(str(tmp_path))
        w.add_scalar("train/loss", 2.0, 1)
        w.flush()
        imp = TensorBoardImporter(tmp_path)
        imp._start()
        got = metrics(imp._poll() + imp._poll())  # step 1 is emitted once a poll finds nothing newer
        assert [r["step"] for r in got] == [1]
        w.add_scalar("train/loss", 1.5, 2)
        w.flush()
        w.close()
        src = next(tmp_path.glob("events.out.tfevents.*"))
        data = src.read_bytes()
        torn = tmp_path / "torn"
        torn.mkdir()
        dst = torn / src.name
        dst.write_bytes(data[:-5])
        imp2 = TensorBoardImporter(torn)
        assert [r["step"] for r in metrics(list(imp2.records()))] == [1]
        with open(dst, "ab") as fh:
            fh.write(data[-5:])
        assert [r["step"] for r in metrics(imp2._poll() + imp2._drain())] == [2]

    def test_real_trainer_events(self, hf_run: dict) -> None:
        """Event files HF's TensorBoard callback wrote during the watched run: every logged loss, and the args as config."""
        found = [d for d in detect_formats(hf_run["output_dir"]) if d.format == "tensorboard"]
        records = list(found[0].open().records())
        truth = [h for h in hf_run["truth"]["log_history"] if "loss" in h]
        got = [r for r in metrics(records) if "loss" in r]
        assert [r["step"] for r in got] == [h["step"] for h in truth]
        assert [r["loss"] for r in got] == pytest.approx([h["loss"] for h in truth], rel=1e-6)
        assert records[0]["config"]["max_steps"] == 12

    def test_without_tensorboard_installed(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without TensorBoard, detection still works and reading says what to install."""
        import sys

        (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
        for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
            monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.setitem(sys.modules, "tensorboard", None)
        found = detect_formats(tmp_path)
        assert [d.format for d in found] == ["tensorboard"]
        with pytest.raises(ImportError, match=r"pip install 'flightlog\[tensorboard\]'"):
            list(found[0].open().records())

    def test_tag_names(self) -> None:
        """Tags map onto protocol names."""
        assert [tag_name(t) for t in ("train/loss", "eval/loss", "train/memory(GiB)", "lr", "perf/tokens per s", "val/acc")] == [
            "loss", "eval_loss", "gpu_memory_mb", "learning_rate", "perf_tokens_per_s", "eval_acc"]


class TestText:
    def test_seeds_console_and_events(self, tmp_path: Path) -> None:
        """The seeds' console format (and the Loss:/LR: variant) and event lines are parsed; other lines ignored."""
        log = tmp_path / "train.log"
        log.write_text(
            "[2024-09-12 14:22:03,187] [INFO] [sft.py:123] loading model\n"
            "some unrelated output\n"
            "Step 45/500 | epoch 0.09 | loss 2.1423 | lr 9.98e-05 | grad_norm 1.234 | gpu_mem 14.2GB/24.0GB | time 1.82s/step\n"
            "Step 50 | Loss: 2.0000 | LR: 9.90e-05\n"
            "[2024-09-12 14:22:09,001] [WARNING] [trainer.py:9] grad norm high\n"
            "Step 55/500 | loss nan | lr 9.8e-05 | gpu_mem 14.2GB/24.0GB\n"
        )
        assert [d.format for d in detect_formats(tmp_path)] == ["text"]
        records = list(TextImporter(log).records())
        m = metrics(records)
        assert m[0] == {**m[0], "step": 45, "epoch": 0.09, "loss": 2.1423, "learning_rate": 9.98e-05, "grad_norm": 1.234,
                        "gpu_memory_mb": pytest.approx(14.2 * 1024), "gpu_memory_total_mb": 24.0 * 1024, "step_time_s": 1.82}
        assert (m[1]["step"], m[1]["loss"], m[1]["learning_rate"]) == (50, 2.0, 9.9e-05)
        assert m[2]["step"] == 55 and m[2]["loss"] != m[2]["loss"]
        events = [r for r in records if r["type"] == "event"]
        assert [(e["level"], e["source"], e["message"]) for e in events] == [("INFO", "sft.py:123", "loading model"), ("WARNING", "trainer.py:9", "grad norm high")]
        assert events[0]["timestamp"].startswith("2024-09-12T")

    def test_hf_dicts_paired_with_progress_bar(self) -> None:
        """HF's printed dicts take their step from the tqdm redraw that follows each one, whatever the interleaving."""
        parser = ConsoleParser(TextImporter.__new__(TextImporter), pair_timeout=60)
        parser.importer = _importer()
        bar = lambda n: f"\r{n * 10}%|##   | {n}/10 [00:01<00:02, 4.2it/s]"  # noqa: E731
        clear = "\r" + " " * 40 + "\r"
        out = []
        out += parser.feed(bar(0) + bar(1) + bar(2), "stderr:1")
        # The dict arrives on stdout before the bar's redraw on stderr is read...
        out += parser.feed("{'loss': '2.5', 'grad_norm': '1.1', 'learning_rate': '5e-05', 'epoch': '0.2'}", "stdout:1")
        assert out == []
        out += parser.feed(clear + bar(2) + bar(3) + bar(4), "stderr:2")
        # ...and here the redraws were read before the dict.
        out += parser.feed(clear + bar(4) + bar(5), "stderr:3")
        out += parser.feed("{'loss': '2.25', 'grad_norm': np.float64(1.0), 'learning_rate': tensor(4e-05), 'epoch': '0.4'}", "stdout:2")
        out += parser.feed("{'train_runtime': '3.0', 'train_loss': '2.4', 'epoch': '1.0'}", "stdout:3")
        out += parser.finish()
        m = metrics(out)
        assert [(r["step"], r.get("loss")) for r in m] == [(2, 2.5), (4, 2.25), (5, None)]
        assert m[1]["grad_norm"] == 1.0 and m[1]["learning_rate"] == 4e-05 and parser.max_steps == 10
        assert out[-1]["type"] == "run_end"

    def test_follow_merged_hf_console_log(self, tmp_path: Path) -> None:
        """`python train.py > train.log 2>&1` followed live: the redraw after a dict is read at once, though tqdm ends it with no newline."""
        log = tmp_path / "train.log"
        bar = lambda n: f"\r{n * 10}%|##   | {n}/10 [00:01<00:02, 4.2it/s]"  # noqa: E731
        clear = "\r" + " " * 40 + "\r"
        log.write_text(bar(0) + bar(1) + bar(2) + clear + "{'loss': '2.5', 'learning_rate': '5e-05', 'epoch': '0.2'}\n" + bar(2))
        imp = TextImporter(log, pair_timeout=30)
        imp._start()
        got = metrics(imp._poll())  # the step is known now, not at the next line
        assert [(r["step"], r["loss"]) for r in got] == [(2, 2.5)]
        with open(log, "a") as fh:
            fh.write(bar(3) + bar(4) + clear + "{'loss': '2.25', 'epoch': '0.4'}\n" + bar(4) + bar(5) + "\n")
        got = metrics(imp._poll() + imp._drain())
        assert [(r["step"], r["loss"]) for r in got] == [(4, 2.25)] and imp.stats.skipped == {}

    @pytest.mark.parametrize("order", ["stderr-first", "stdout-first", "interleaved-1", "interleaved-2", "interleaved-3"])
    def test_real_hf_console_any_interleaving(self, order: str) -> None:
        """HF Trainer's real console (logging every step, eval and checkpoint every 6, whose shard bar leaves an extra
        clear-and-redraw): every dict gets HF's own step however stdout and stderr interleave."""
        import random

        from flightlog.store.importers.text import SegmentSplitter

        base = Path(__file__).parent / "fixtures" / "hf_console"
        streams = {name: (base / f"{name}.txt").read_bytes() for name in ("stdout", "stderr")}
        chunks = {name: [data[i:i + 97] for i in range(0, len(data), 97)] for name, data in streams.items()}
        if order == "stderr-first":
            sequence = [("stderr", c) for c in chunks["stderr"]] + [("stdout", c) for c in chunks["stdout"]]
        elif order == "stdout-first":
            sequence = [("stdout", c) for c in chunks["stdout"]] + [("stderr", c) for c in chunks["stderr"]]
        else:
            rng = random.Random(order)
            pending = {k: list(v) for k, v in chunks.items()}
            sequence = []
            while any(pending.values()):
                name = rng.choice([k for k, v in pending.items() if v])
                sequence.append((name, pending[name].pop(0)))
        parser = ConsoleParser(_importer(), pair_timeout=1e9)
        splitters = {"stdout": SegmentSplitter(), "stderr": SegmentSplitter()}
        out: list[dict] = []
        for name, chunk in sequence:
            for segment, line in splitters[name].feed(chunk):
                out += parser.feed(segment, f"{name}:{line}")
        out += parser.finish()
        # The Trainer's own log_history of that run: steps 1-6, eval at 6, 7-12, eval at 12, summary at 12.
        assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5, 6, 6, 7, 8, 9, 10, 11, 12, 12, 12]
        assert [r["loss"] for r in metrics(out) if "loss" in r][7] == 166.2

    def test_dataset_bar_before_training_bar(self) -> None:
        """A finished dataset-map bar before training does not hide the training bar; eval bars during training are ignored."""
        parser = ConsoleParser(_importer(), pair_timeout=60)
        clear = "\r" + " " * 40 + "\r"
        out = parser.feed("\rMap: 100%|####| 64/64 [00:00<00:00, 999.0 examples/s]", "stderr:1")
        out += parser.feed("\r  0%|     | 0/10 [00:00<?, ?it/s]\r 30%|##   | 3/10 [00:01<00:02, 4.2it/s]", "stderr:2")
        out += parser.feed("\r 50%|##   | 4/8 [00:00<00:00]" + clear + "\r 30%|##   | 3/10 [00:01<00:02]" + "\r 50%|##   | 4/8 [00:00<00:00]", "stderr:3")
        out += parser.feed("{'eval_loss': '2.5', 'epoch': '0.3'}", "stdout:1")
        assert [(r["step"], r["eval_loss"]) for r in metrics(out)] == [(3, 2.5)] and parser.max_steps == 10

    def test_stale_redraws_are_not_partners(self) -> None:
        """A redraw left by some other tqdm.write long before a dict does not give that dict its step."""
        now = [0.0]
        parser = ConsoleParser(_importer(), pair_timeout=1.0, clock=lambda: now[0])
        bar = lambda n: f"\r{n * 10}%|##   | {n}/10 [00:01<00:02, 4.2it/s]"  # noqa: E731
        clear = "\r" + " " * 40 + "\r"
        assert parser.feed(bar(1) + clear + bar(1), "stderr:1") == []  # a warning printed through tqdm.write
        now[0] = 30.0
        out = parser.feed("{'loss': '2.5', 'epoch': '0.6'}", "stdout:1") + parser.feed(bar(5) + bar(6) + clear + bar(6), "stderr:2")
        assert [(r["step"], r["loss"]) for r in metrics(out)] == [(6, 2.5)]

    def test_swift_dicts_and_step_prefix(self) -> None:
        """ms-swift's printed dicts carry their own step; the seeds' '[Step N] {...}' prefix gives it too."""
        parser = ConsoleParser(_importer())
        out = parser.feed(str(NEW[0]), "1") + parser.feed("[Step 7] {'loss': 1.25, 'learning_rate': 0.0001}", "2") + parser.feed("{'not': 'a log'}", "3")
        m = metrics(out)
        assert [(r["step"], r["loss"]) for r in m] == [(45, 2.1423), (7, 1.25)] and parser.max_steps == 500

    def test_user_regex(self, tmp_path: Path) -> None:
        """A user template with named groups parses other formats; a bad one is a clear error."""
        log = tmp_path / "custom.txt"
        log.write_text("it=3 loss=0.5 acc=0.9\nit=x loss=0.4\nit=4 loss=bad acc=0.95\nERR: disk full\n")
        imp = TextImporter(log, patterns=[r"it=(?P<step>\S+) loss=(?P<loss>\S+)(?: acc=(?P<acc>\S+))?", r"^(?P<level>ERR): (?P<message>.*)"])
        records = list(imp.records())
        assert [(r["step"], r.get("loss"), r.get("acc")) for r in metrics(records)] == [(3, 0.5, 0.9), (4, None, 0.95)]
        assert imp.stats.skipped == {"unreadable step": 1} and imp.stats.dropped_values == {"loss": 1}
        assert any(r["type"] == "event" and r["message"] == "disk full" for r in records)
        with pytest.raises(ValueError, match="not a valid regular expression"):
            TextImporter(log, patterns=["(?P<step"])
        with pytest.raises(ValueError, match="needs a"):
            TextImporter(log, patterns=[r"(?P<loss>\d+)"])

    def test_incomplete_last_line(self, tmp_path: Path) -> None:
        """A last line without its newline could be cut mid-number: it is counted, not parsed."""
        log = tmp_path / "train.log"
        log.write_text("Step 1/5 | loss 2.5\nStep 2/5 | loss 2.4")
        imp = TextImporter(log)
        assert [r["step"] for r in metrics(list(imp.records()))] == [1]
        assert imp.stats.skipped == {"incomplete last line": 1}


def _importer():
    from flightlog.store.importers.base import Importer

    imp = Importer(Path("."))
    imp.format = "console"
    return imp


def test_unknown_format_and_missing_dir(tmp_path: Path) -> None:
    """Clear errors for an unknown format and a folder that does not exist."""
    with pytest.raises(ValueError, match="unknown import format 'wandb'"):
        open_importer("wandb", tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        detect_formats(tmp_path / "nope")


def test_import_stays_light() -> None:
    """Importing the importers pulls in neither torch nor tensorboard."""
    import subprocess
    import sys

    code = "import sys, flightlog.store.importers, flightlog.store.importers.text, flightlog.store.importers.swift; print('torch' in sys.modules, 'tensorboard' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    assert out.stdout.split() == ["False", "False"], out.stderr
