"""The run index: --where parsing, SQL queries, the writer's hook, folder scans, crashes."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flightlog
from flightlog.protocol import format_timestamp
from flightlog.store.entry import entry_from_run_dir
from flightlog.store.index import IndexUnavailable, RunIndex, RunNotFound
from flightlog.store.scan import scan
from flightlog.store.where import WhereError, parse

ROOT = Path(__file__).resolve().parent.parent


def lora_run(root: Path, rank: int, alpha: int, steps: int = 30, task: str = "sft", **extra) -> flightlog.Run:
    """A finished run like the seeds' LoRA A/B experiments: better accuracy with a larger rank."""
    run = flightlog.init(
        output_dir=root / f"lora-r{rank}",
        run_name=f"lora-r{rank}",
        task_type=task,
        model_name="qwen3-7b",
        dataset="alpaca-en",
        config={"lora_rank": rank, "lora_alpha": alpha, "optim": {"name": "adamw", "lr": 2e-5}, "bf16": True},
        sinks=["jsonl"],
        install_signal_handlers=False,
        **extra,
    )
    for step in range(1, steps + 1):
        run.log({"loss": 2.0 / math.sqrt(step * rank), "learning_rate": 2e-5}, step=step)
        if step % 10 == 0:
            run.log({"eval_accuracy": 0.5 + 0.05 * math.log2(rank) * step / steps}, step=step)
    run.finish()
    return run


@pytest.fixture
def runs(tmp_path):
    return [lora_run(tmp_path / "out", r, a) for r, a in ((8, 16), (32, 64), (64, 128))]


class TestWhere:
    @pytest.mark.parametrize(
        ("text", "message", "pos"),
        [
            ("", "empty expression", 0),
            ("task=", "expected a value", 5),
            ("task sft", "expected an operator", 5),
            ("(task=sft", "expected ')'", 9),
            ("task=sft lora_rank>3", "missing 'and' or 'or'", 9),
            ("task=sft and", "expected a field name", 12),
            ("a=1 & b=2", "unexpected '&' (missing 'and' or 'or'?)", 4),
            ("=3", "expected a field name", 0),
        ],
    )
    def test_errors_point_at_the_position(self, text, message, pos):
        """A malformed expression names what was wrong and where, with a caret."""
        with pytest.raises(WhereError) as info:
            parse(text)
        assert message in str(info.value)
        assert info.value.pos == pos
        assert str(info.value).endswith(" " * (pos + 2) + "^")

    def test_precedence_and_grouping(self):
        """'and' binds tighter than 'or'; parentheses and 'not' nest."""
        tree = parse("a=1 or b=2 and not (c>3 or d~'x y')")
        assert tree.op == "or" and tree.items[1].op == "and"
        assert tree.items[1].items[1].item.op == "or"
        assert tree.items[1].items[1].item.items[1].value == "x y"


    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(list("abn_ =!<>~()'\"\\.*-0123456789") + [" and ", " or ", "not ", "task", "lora_rank"]), max_size=25).map("".join))
    def test_any_text_parses_or_fails_cleanly(self, text):
        """Whatever is typed, the parser returns a tree or raises WhereError, nothing else."""
        try:
            parse(text)
        except WhereError as exc:
            assert 0 <= exc.pos <= len(text)


class TestQuery:
    def test_filters_over_fields_params_and_metrics(self, runs):
        """--where combines run fields, hyper-parameters (nested too) and best/final metrics."""
        with RunIndex() as index:
            names = lambda where, **kw: [r["name"] for r in index.query(where, **kw)]  # noqa: E731
            assert names("task=sft and lora_rank>=32", sort="lora_rank") == ["lora-r32", "lora-r64"]
            assert names("eval_accuracy>0.7") == ["lora-r64", "lora-r32"]
            assert names("best.eval_accuracy<0.7 or optim.name!=adamw") == ["lora-r8"]
            assert names("final.loss<0.07", sort="-final.loss") == ["lora-r32", "lora-r64"]
            assert names("best_loss<=0.05 and bf16=true") == ["lora-r64"]
            assert names("name~R3 or name~'*-r6?'", sort="name:asc") == ["lora-r32", "lora-r64"]
            assert names("not lora_rank=32 and status=finished and duration<1h and steps=30", sort="name") == ["lora-r64", "lora-r8"]
            assert names("model!~qwen") == []
            assert names(None, sort="-lora_alpha", limit=2) == ["lora-r64", "lora-r32"]

    def test_random_expressions_query_or_fail_cleanly(self, runs):
        """Random expressions over real fields either run as SQL or raise WhereError, never a SQLite error."""
        import random

        rng = random.Random(7)
        fields = ["task", "lora_rank", "best.loss", "final.learning_rate", "eval_accuracy", "status", "duration", "optim.name", "name", "x"]
        values = ["sft", "32", "'a b'", "0.5", "2h", "*r3*", "\"x'y\"", "-1", "1e-5", "finished"]
        ops = ["=", "!=", "<", "<=", ">", ">=", "~", "!~"]
        with RunIndex() as index:
            for _ in range(300):
                parts = []
                for i in range(rng.randint(1, 4)):
                    if i:
                        parts.append(rng.choice(["and", "or", "and not"]))
                    atom = f"{rng.choice(fields)}{rng.choice(ops)}{rng.choice(values)}"
                    parts.append(f"({atom})" if rng.random() < 0.3 else atom)
                text = " ".join(parts)
                try:
                    index.query(text, sort=rng.choice([None, "-lora_rank", "eval_accuracy:desc", "name"]))
                except WhereError:
                    pass

    def test_values_are_parameters_not_sql(self, runs):
        """A value that looks like SQL is compared as text; the tables survive."""
        with RunIndex() as index:
            assert index.query("""name="x' OR 1=1; DROP TABLE runs; --" """) == []
            assert index.query("name~\"%\"") == []
            assert index.count() == 3

    def test_unknown_field_and_wrong_type(self, runs):
        """Typos in field names and non-numbers for numeric fields are errors with positions."""
        with RunIndex() as index:
            with pytest.raises(WhereError, match="unknown field 'lora_rnak'") as info:
                index.query("task=sft and lora_rnak>3")
            assert info.value.pos == 13
            with pytest.raises(WhereError, match="duration needs a number"):
                index.query("duration>soon")
            assert [r["name"] for r in index.query("duration<2m")] != []

    def test_resolve_by_id_prefix_and_name(self, runs):
        """A run is found by its id, a unique id prefix or its name (the latest of that name)."""
        with RunIndex() as index:
            run = runs[1]
            assert index.resolve(run.run_id) == run.run_id
            assert index.resolve(run.run_id[:-3]) == run.run_id or len({r.run_id[:-3] for r in runs}) < 3
            assert index.resolve("lora-r32") == run.run_id
            with pytest.raises(RunNotFound, match="no run 'lora-r99'"):
                index.resolve("lora-r99")
            with pytest.raises(RunNotFound, match="ambiguous"):
                index.resolve("20")
            full = index.get("lora-r32")
            assert full["params"] == {"lora_rank": 32, "lora_alpha": 64, "optim.name": "adamw", "optim.lr": 2e-5, "bf16": True}
            assert full["best"]["eval_accuracy"]["step"] == 30
            assert full["final"]["learning_rate"] == 2e-5

    def test_unreadable_index(self, home):
        """A file that is not SQLite gives a clear error, not a traceback."""
        home.mkdir(parents=True)
        (home / "index.sqlite").write_bytes(b"this is not a database" * 100)
        with pytest.raises(IndexUnavailable, match="cannot open the run index"):
            RunIndex()
        with pytest.raises(IndexUnavailable, match="no run index"):
            RunIndex(home / "missing.sqlite", create=False)


class TestWriterHook:
    def test_live_run_is_indexed_then_finished(self, tmp_path):
        """The heartbeat keeps the index current while the run trains; finish records the summary."""
        run = flightlog.init(output_dir=tmp_path / "live", run_name="live", sinks=["jsonl"], heartbeat_interval=0.1, install_signal_handlers=False)
        with RunIndex() as index:
            assert index.get("live")["status"] == "running"
            for step in range(1, 21):
                run.log({"loss": 1.0 / step}, step=step)
            deadline = time.monotonic() + 10
            while (index.get("live")["last_step"] or 0) < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            live = index.get("live")
            assert live["last_step"] == 20 and live["status"] == "running"
            assert live["best"]["loss"]["value"] == pytest.approx(0.05)
            run.finish()
            done = index.get("live")
        assert done["status"] == "finished" and done["end_time"]
        assert done["final"]["loss"] == pytest.approx(0.05)

    def test_locked_index_does_not_stall_training(self, tmp_path, home):
        """While another process holds the index's write lock, the run trains and writes on."""
        import sqlite3

        RunIndex().close()
        blocker = sqlite3.connect(home / "index.sqlite", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            began = time.monotonic()
            run = flightlog.init(output_dir=tmp_path / "r", run_name="locked", sinks=["jsonl"], heartbeat_interval=0.05, install_signal_handlers=False)
            for step in range(1, 51):
                run.log({"loss": 1.0 / step}, step=step)
            time.sleep(0.3)
            run.finish()
            elapsed = time.monotonic() - began
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert elapsed < 5.0  # each index write gives up after 0.25 s instead of waiting 10 s
        assert len(flightlog.load(run.log_dir)) == 50

    def test_index_off_and_broken_index_never_hurt_training(self, tmp_path, monkeypatch):
        """index=False writes nothing; an index that cannot be opened costs the run nothing."""
        run = flightlog.init(output_dir=tmp_path / "a", sinks=["jsonl"], index=False, install_signal_handlers=False)
        run.log({"loss": 1.0}, step=1)
        run.finish()
        assert not (tmp_path / "home").exists()
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        monkeypatch.setenv("FLIGHTLOG_HOME", str(blocker))
        run = flightlog.init(output_dir=tmp_path / "b", sinks=["jsonl"], heartbeat_interval=0.05, install_signal_handlers=False)
        for step in range(1, 6):
            run.log({"loss": 1.0}, step=step)
        time.sleep(0.2)
        run.finish()
        assert len(flightlog.load(run.log_dir)) == 5
        assert orjson.loads((run.log_dir / "run.json").read_bytes())["status"] == "finished"


class TestScan:
    def test_scan_finds_runs_and_skips_checkpoints(self, tmp_path, home):
        """index DIR finds every run.json below, not inside checkpoint folders, and names copies."""
        lora_run(tmp_path / "exp" / "a", 8, 16, index=False)
        lora_run(tmp_path / "exp" / "b" / "deeper", 16, 32, index=False)
        ckpt = tmp_path / "exp" / "a" / "lora-r8" / "checkpoint-30"
        (ckpt / "logs").mkdir(parents=True)
        (ckpt / "logs" / "run.json").write_bytes(b'{"run_id": "inside-a-checkpoint"}')
        (tmp_path / "exp" / "broken" / "logs").mkdir(parents=True)
        (tmp_path / "exp" / "broken" / "logs" / "run.json").write_bytes(b"{not json")
        (tmp_path / "exp" / "swift" / "v0-20260101").mkdir(parents=True)
        (tmp_path / "exp" / "swift" / "v0-20260101" / "logging.jsonl").write_text('{"loss": 1.0}\n')
        with RunIndex() as index:
            result = scan([tmp_path / "exp", tmp_path / "nope"], index)
            # the ms-swift folder is indexed through the importers
            assert sorted(index.get(r)["name"] for r in result.indexed) == ["lora-r16", "lora-r8", "v0-20260101"]
            assert index.get("lora-r8")["checkpoints"] == [str(ckpt)]
        assert {Path(f).name for f, _ in result.errors} == {"logs", "nope"}
        assert result.foreign_unhandled == []

    def test_crashed_run_recognised_and_summarised_from_stream(self, tmp_path):
        """A run killed with SIGKILL is 'crashed' once its heartbeat is stale; best/final come from its stream."""
        script = textwrap.dedent(
            f"""
            import os, signal, flightlog
            run = flightlog.init(output_dir={str(tmp_path / 'crash')!r}, run_name="crash", sinks=["jsonl"],
                                 config={{"lora_rank": 8}}, heartbeat_interval=5.0, install_signal_handlers=False)
            for step in range(1, 41):
                run.log({{"loss": abs(step - 25) + 1.0, "eval_acc": step / 100}}, step=step)
            run.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60)
        assert proc.returncode == -signal.SIGKILL
        log_dir = tmp_path / "crash" / "logs"
        meta = orjson.loads((log_dir / "run.json").read_bytes())
        assert meta["status"] == "running" and "summary" not in meta
        with RunIndex() as index:
            assert index.get("crash")["status"] == "running"  # the heartbeat is still fresh
            meta["heartbeat"] = format_timestamp(time.time() - 120)  # two minutes later, nobody beat
            (log_dir / "run.json").write_bytes(orjson.dumps(meta))
            scan([tmp_path], index)
            crashed = index.get("crash")
            assert crashed["status"] == "crashed" and crashed["recorded_status"] == "running"
            assert [r["name"] for r in index.query("status=crashed")] == ["crash"]
        assert crashed["best"]["loss"] == {"value": 1.0, "step": 25}
        assert crashed["best"]["eval_acc"] == {"value": 0.4, "step": 40}
        assert crashed["last_step"] == 40 and crashed["final"]["loss"] == 16.0

    def test_moved_folder_points_at_its_new_place(self, tmp_path):
        """A run folder copied elsewhere is indexed where it is now, not where it was written."""
        run = lora_run(tmp_path / "old", 8, 16, index=False)
        new = tmp_path / "new" / "lora-r8"
        new.parent.mkdir()
        os.rename(run.output_dir, new)
        entry = entry_from_run_dir(new / "logs")
        assert entry["log_dir"] == str((new / "logs").resolve())
        assert entry["output_dir"] == str(new.resolve())


def test_foreign_folders_through_the_importer_seam(tmp_path, monkeypatch):
    """A folder another tool wrote is indexed by whatever importer FOREIGN names, via entry_from_records."""
    import types

    from flightlog.store import scan as scan_module
    from flightlog.store.entry import entry_from_records

    def index_entry(folder):
        lines = (folder / "logging.jsonl").read_text().splitlines()
        records = [{"type": "run_start", "timestamp": "2026-01-01T00:00:00.000Z", "run_name": "swift-sft", "task_type": "sft", "config": {"lora_rank": 16}}]
        for i, line in enumerate(lines, start=1):
            records.append({"type": "metrics", "timestamp": f"2026-01-01T00:00:{i:02d}.000Z", "step": i, **orjson.loads(line)})
        return entry_from_records(records, folder, source="ms-swift")

    monkeypatch.setitem(sys.modules, "fake_importer", types.SimpleNamespace(index_entry=index_entry))
    monkeypatch.setattr(scan_module, "FOREIGN", ["fake_importer:index_entry"])
    folder = tmp_path / "swift" / "v0-20260101-000000"
    folder.mkdir(parents=True)
    (folder / "logging.jsonl").write_text('{"loss": 2.0, "acc": 0.5}\n{"loss": 1.5, "acc": 0.7}\n{"loss": 1.7, "acc": 0.6}\n')
    with RunIndex() as index:
        first = scan([tmp_path / "swift"], index)
        second = scan([tmp_path / "swift"], index)  # a rescan updates the same entry
        assert first.indexed == second.indexed and index.count() == 1
        run = index.get("swift-sft")
    assert run["source"] == "ms-swift" and run["params"] == {"lora_rank": 16} and run["last_step"] == 3
    assert run["best"]["loss"] == {"value": 1.5, "step": 2} and run["best"]["acc"]["value"] == 0.7
    assert run["final"]["loss"] == 1.7 and run["status"] == "unknown"


def test_goal_rule_is_the_protocols():
    """The store, the writer and compare share one better-direction rule (protocol.metric_goal)."""
    from flightlog.pipeline import summary
    from flightlog.protocol import metric_goal
    from flightlog.store import summarize

    assert summary.metric_goal is metric_goal and summarize.metric_goal is metric_goal
    names = ["loss", "eval_loss", "eval_accuracy", "learning_rate", "step_time_s", "epoch"]
    assert [metric_goal(n) for n in names] == [-1, -1, 1, 0, 0, 0]

def test_index_scans_ms_swift_and_hf_folders_through_the_importers(tmp_path):
    """`flightlog index DIR` indexes an ms-swift run folder and an HF output folder via the real importers."""
    from flightlog.store import scan as scan_module

    assert scan_module.FOREIGN == ["flightlog.store.importers.index:index_entry"]
    swift = tmp_path / "runs" / "swift-out" / "v0-20260101-000000"
    swift.mkdir(parents=True)
    lines = [
        {"loss": 2.1, "grad_norm": 1.2, "learning_rate": 1e-4, "memory(GiB)": 14.2, "train_speed(iter/s)": 0.5, "epoch": 0.09, "global_step/max_steps": "45/500"},
        {"loss": 1.8, "grad_norm": 1.1, "learning_rate": 9e-5, "memory(GiB)": 14.3, "train_speed(iter/s)": 0.5, "epoch": 0.1, "global_step/max_steps": "50/500"},
        {"eval_loss": 1.9, "eval_acc": 0.61, "epoch": 0.1, "global_step/max_steps": "50/500"},
    ]
    (swift / "logging.jsonl").write_text("".join(orjson.dumps(line).decode() + "\n" for line in lines))
    hf = tmp_path / "runs" / "hf-out"
    hf.mkdir(parents=True)
    (hf / "trainer_state.json").write_text(orjson.dumps({
        "global_step": 20, "max_steps": 20, "epoch": 1.0, "best_metric": None,
        "log_history": [{"loss": 3.0, "learning_rate": 1e-3, "epoch": 0.5, "step": 10}, {"loss": 2.5, "learning_rate": 5e-4, "epoch": 1.0, "step": 20}],
    }).decode())
    with RunIndex() as index:
        result = scan([tmp_path / "runs"], index)
        assert result.foreign_unhandled == [] and len(result.indexed) == 2
        runs = {r["source"]: r for r in (index.get(run_id) for run_id in result.indexed)}
    assert runs["ms-swift"]["last_step"] == 50 and runs["ms-swift"]["best"]["loss"]["value"] == 1.8
    assert runs["ms-swift"]["best"]["eval_acc"]["value"] == 0.61
    assert runs["hf"]["last_step"] == 20 and runs["hf"]["final"]["loss"] == 2.5
