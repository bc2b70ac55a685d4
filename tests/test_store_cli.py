"""The run-store commands on real runs made with flightlog.init in temporary folders."""

from __future__ import annotations

import gzip
import io
import math
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import orjson
import pytest

import flightlog
from flightlog.cli import main as cli
from flightlog.protocol import decode

ROOT = Path(__file__).resolve().parent.parent


def lora_run(root: Path, rank: int, alpha: int, steps: int = 40, **options) -> flightlog.Run:
    """The seeds' LoRA A/B experiment: accuracy grows with the rank."""
    options.setdefault("sinks", ["jsonl"])
    run = flightlog.init(
        output_dir=root / f"lora-r{rank}",
        run_name=f"lora-r{rank}",
        task_type="sft",
        model_name="qwen3-7b",
        dataset="alpaca-en",
        config={"lora_rank": rank, "lora_alpha": alpha, "learning_rate": 1e-4},
        install_signal_handlers=False,
        **options,
    )
    for step in range(1, steps + 1):
        run.log({"loss": 3.0 / math.sqrt(step) + 8 / rank, "learning_rate": 1e-4, "grad_norm": float("nan") if step == 7 else 1.0}, step=step)
        if step % 10 == 0:
            run.log({"eval_accuracy": round(0.4 + 0.08 * math.log2(rank) * step / steps, 4)}, step=step)
        if step == 20:
            run.event("saving checkpoint", level="WARNING")
            (run.output_dir / "checkpoint-20").mkdir(parents=True, exist_ok=True)
            (run.output_dir / "checkpoint-20" / "adapter.bin").write_bytes(os.urandom(4096))
    run.finish()
    return run


@pytest.fixture
def runs(tmp_path):
    return [lora_run(tmp_path / "out", r, a) for r, a in ((8, 16), (32, 64), (64, 128))]


def call(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestIndexAndLs:
    def test_index_dir_then_ls_where_sort(self, tmp_path, capsys):
        """Runs recorded without the hook are found by 'index DIR' and filtered by 'ls --where'."""
        for rank, alpha in ((8, 16), (32, 64), (64, 128)):
            lora_run(tmp_path / "exp", rank, alpha, index=False)
        code, out, err = call(capsys, "index", str(tmp_path / "exp"))
        assert code == 0, err
        assert "indexed 3 run(s)" in out
        code, out, _ = call(capsys, "ls", "--where", "task=sft and lora_rank>=32", "--sort", "eval_accuracy:desc")
        lines = out.splitlines()
        assert code == 0
        assert lines[0].split()[:3] == ["run_id", "name", "task"] and "lora_rank" in lines[0] and "best.eval_accuracy" in lines[0]
        assert [line.split()[1] for line in lines[1:]] == ["lora-r64", "lora-r32"]
        code, out, _ = call(capsys, "ls", "--json", "--sort=-lora_alpha", "-c", "final.loss", "-n", "2")
        rows = [orjson.loads(line) for line in out.splitlines()]
        assert [(r["name"], r["lora_alpha"]) for r in rows] == [("lora-r64", 128), ("lora-r32", 64)]
        assert rows[0]["final.loss"] == pytest.approx(3.0 / math.sqrt(40) + 8 / 64)

    def test_bad_where_points_at_the_position(self, runs, capsys):
        """A malformed --where exits 2 with the expression and a caret under the fault."""
        code, out, err = call(capsys, "ls", "--where", "task=sft and (lora_rank>=32")
        assert code == 2 and out == ""
        assert "bad --where expression: position 28: expected ')'" in err
        assert err.rstrip().endswith(" " * 29 + "^")
        code, _, err = call(capsys, "ls", "--where", "lora_rnak>=32")
        assert code == 2 and "unknown field 'lora_rnak'" in err

    def test_index_errors(self, tmp_path, capsys):
        """index on a missing folder or an unreadable index exits non-zero with the reason."""
        code, _, err = call(capsys, "index", str(tmp_path / "nope"))
        assert code == 1 and "not a directory" in err
        (tmp_path / "home").mkdir(exist_ok=True)
        (tmp_path / "home" / "index.sqlite").write_bytes(b"garbage" * 1000)
        code, _, err = call(capsys, "ls")
        assert code == 1 and "cannot open the run index" in err and "Traceback" not in err

    def test_ls_before_any_index(self, capsys):
        """ls with no index yet says how to make one."""
        code, _, err = call(capsys, "ls")
        assert code == 1 and "flightlog index DIR" in err


class TestShowCompare:
    def test_show(self, runs, capsys):
        """show gives status, hyper-parameters, best metrics with their step, and paths."""
        code, out, _ = call(capsys, "show", "lora-r32")
        assert code == 0
        assert f"run          {runs[1].run_id}  lora-r32" in out
        assert "status       finished" in out
        assert "checkpoints  1: " in out and "checkpoint-20" in out
        assert str(runs[1].log_dir / "train.jsonl") in out
        row = next(line.split() for line in out.splitlines() if line.startswith("eval_accuracy"))
        assert row == ["eval_accuracy", "0.8", "40", "0.8"]
        assert next(line.split() for line in out.splitlines() if line.startswith("lora_rank")) == ["lora_rank", "32"]
        code, out, _ = call(capsys, "show", runs[0].run_id[:-2], "--json")
        assert orjson.loads(out)["params"]["lora_alpha"] == 16

    def test_show_by_folder_and_unknown_run(self, tmp_path, runs, capsys):
        """A run folder works as RUN; an unknown run exits 1 naming it."""
        code, out, _ = call(capsys, "show", str(runs[2].output_dir))
        assert code == 0 and "lora-r64" in out
        code, out, err = call(capsys, "show", "no-such-run")
        assert code == 1 and "no run 'no-such-run'" in err and out == ""

    def test_compare_ab_table(self, runs, capsys):
        """compare: differing hyper-parameters and best metrics side by side, the best marked."""
        code, out, _ = call(capsys, "compare", "lora-r8", "lora-r32", "lora-r64")
        assert code == 0
        table = {line.split()[0] if not line.startswith("best") else " ".join(line.split()[:2]): line.split() for line in out.splitlines()[1:]}
        assert table["lora_rank"][1:] == ["8", "32", "64"]
        assert table["lora_alpha"][1:] == ["16", "64", "128"]
        assert "learning_rate" not in table  # the same in every run
        assert table["best eval_accuracy"][2:] == ["0.64", "0.8", "0.88", "*"]
        assert table["best loss"][-1] == "*"
        code, out, _ = call(capsys, "compare", "--where", "lora_rank>8", "--metrics", "eval_accuracy")
        assert out.splitlines()[0].split() == ["lora-r64", "lora-r32"]
        code, _, err = call(capsys, "compare", "lora-r8")
        assert code == 2 and "at least two runs" in err


class TestExport:
    def test_csv_parquet_jsonl(self, tmp_path, runs, capsys):
        """export writes every metrics record; each format reads back with the usual tools."""
        import pandas as pd
        import polars as pl

        code, _, err = call(capsys, "export", "lora-r8", "--format", "csv", "-o", str(tmp_path / "m.csv"))
        assert code == 0 and "wrote 44 records" in err
        frame = pd.read_csv(tmp_path / "m.csv")
        assert len(frame) == 44 and frame["step"].max() == 40 and math.isnan(frame.loc[frame["step"] == 7, "grad_norm"].iloc[0])
        code, _, _ = call(capsys, "export", "lora-r8", "-o", str(tmp_path / "all.parquet"), "--type", "all")
        table = pl.read_parquet(tmp_path / "all.parquet")
        assert set(table["type"]) >= {"run_start", "metrics", "event", "run_end"}  # and the rules' alert on the NaN
        code, out, _ = call(capsys, "export", "lora-r8", "--format", "jsonl", "--type", "event")
        assert [decode(line)["message"] for line in out.splitlines()] == ["saving checkpoint"]
        code, out, _ = call(capsys, "export", "lora-r8", "--format", "csv", "--type", "run_start")
        assert '"lora_rank"' in out  # nested config as JSON text in a CSV cell

    def test_export_errors(self, tmp_path, runs, capsys):
        """Unknown format, parquet to stdout and unknown types are refused with exit 2."""
        assert call(capsys, "export", "lora-r8", "-o", str(tmp_path / "x.txt"))[0] == 2
        assert call(capsys, "export", "lora-r8", "--format", "parquet")[0] == 2
        code, _, err = call(capsys, "export", "lora-r8", "--format", "csv", "--type", "metric")
        assert code == 2 and "unknown record type" in err


class TestTail:
    def test_last_records_with_filters(self, runs, capsys):
        """tail shows the last N records that pass --type, --grep and --fields."""
        code, out, _ = call(capsys, "tail", "lora-r8", "-n", "3", "--type", "metrics", "--fields", "loss")
        lines = out.splitlines()
        assert code == 0 and len(lines) == 3
        assert lines[-1].split()[1:4] == ["step", "40", "loss"]
        code, out, _ = call(capsys, "tail", "lora-r8", "--grep", "eval_acc", "-n", "100", "--json")
        assert [decode(line)["type"] for line in out.splitlines()] == ["metrics"] * 4 + ["run_end"]  # its summary names it
        assert [decode(line)["step"] for line in out.splitlines()][:4] == [10, 20, 30, 40]
        code, out, _ = call(capsys, "tail", "lora-r8", "--grep", "WARN", "-i")
        assert "[WARNING]" in out and "saving checkpoint" in out
        code, _, err = call(capsys, "tail", "lora-r8", "--grep", "(")
        assert code == 2 and "bad --grep" in err

    def test_last_lines_reads_backwards_across_chunks(self, tmp_path):
        """The last N matching lines are found from the end, across chunk borders, sparse or not."""
        from flightlog.store.follow import last_lines

        path = tmp_path / "s.jsonl"
        path.write_bytes(b"".join(b'{"i":%d,"even":%s}\n' % (i, b"true" if i % 2 == 0 else b"false") for i in range(5000)) + b'{"i":50')
        lines, offset, _ = last_lines(path, 3, lambda line: True, chunk=64)
        assert [orjson.loads(x)["i"] for x in lines] == [4997, 4998, 4999]
        assert offset == path.stat().st_size - len(b'{"i":50')  # follow from after the last complete line
        rare = last_lines(path, 2, lambda line: line.startswith(b'{"i":1,') or line.startswith(b'{"i":4000,'), chunk=64)[0]
        assert [orjson.loads(x)["i"] for x in rare] == [1, 4000]
        assert last_lines(path, 0, lambda line: True)[0] == []

    @pytest.mark.slow
    def test_follow_live_run_until_it_ends(self, tmp_path):
        """tail -f prints records as a live run writes them and returns at its run_end."""
        run = flightlog.init(output_dir=tmp_path / "live", run_name="live", sinks=["jsonl"], flush_interval=0.05, install_signal_handlers=False)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightlog", "tail", "live", "-f", "--type", "metrics", "--fields", "loss", "--poll", "0.05", "-n", "1000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            for step in range(1, 31):
                run.log({"loss": 1.0 / step, "lr": 0.1}, step=step)
                time.sleep(0.02)
            run.finish()
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        steps = [int(line.split()[2]) for line in out.decode().splitlines()]
        assert steps == list(range(1, 31))
        assert "lr" not in out.decode()


class TestArchive:
    def test_archive_local_restore_and_show(self, tmp_path, runs, capsys):
        """archive writes a verified tar.gz, the index and 'show' point at it, --restore brings it back."""
        code, out, err = call(capsys, "archive", "lora-r32", str(tmp_path / "vault"), "--checkpoints")
        assert code == 0, err
        url = str(tmp_path / "vault" / f"{runs[1].run_id}.tar.gz")
        assert f"to {url}" in out and "verified" in out
        with tarfile.open(url, "r:gz") as tar:
            names = set(tar.getnames())
        assert {f"{runs[1].run_id}/logs/train.jsonl", f"{runs[1].run_id}/logs/run.json", f"{runs[1].run_id}/checkpoint-20/adapter.bin"} <= names
        assert f"archive      {url}" in call(capsys, "show", "lora-r32")[1]
        assert [r["name"] for r in flightlog.runs(where=f"archive~{runs[1].run_id}")] == ["lora-r32"]
        code, out, err = call(capsys, "archive", "--restore", "lora-r32", str(tmp_path / "restored"))
        assert code == 0, err
        restored = tmp_path / "restored" / runs[1].run_id / "logs"
        assert (restored / "train.jsonl").read_bytes() == (runs[1].log_dir / "train.jsonl").read_bytes()
        assert flightlog.load(restored)["loss"].equals(flightlog.load(runs[1].log_dir)["loss"])

    def test_archive_to_fsspec_memory(self, runs, capsys):
        """Any fsspec URL works; the archive is gzip-compressed and holds the stream byte for byte."""
        import fsspec

        code, out, err = call(capsys, "archive", "lora-r8", "memory://bucket/runs")
        assert code == 0, err
        url = f"memory://bucket/runs/{runs[0].run_id}.tar.gz"
        data = fsspec.open(url, "rb").open().read()
        assert data[:2] == b"\x1f\x8b"
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
            stream = tar.extractfile(f"{runs[0].run_id}/logs/train.jsonl").read()
        assert stream == (runs[0].log_dir / "train.jsonl").read_bytes()
        assert flightlog.runs(where="name=lora-r8")[0]["archive"] == url

    def test_archive_errors(self, tmp_path, runs, capsys):
        """Unknown protocol, a missing archive and a running run are refused with a reason."""
        code, _, err = call(capsys, "archive", "lora-r8", "nosuchproto://x/y")
        assert code == 1 and "cannot open 'nosuchproto://x/y" in err
        code, _, err = call(capsys, "archive", "--restore", "lora-r64", str(tmp_path / "r"))
        assert code == 1 and "has no archive" in err
        code, _, err = call(capsys, "archive", "--restore", str(tmp_path / "missing.tar.gz"), str(tmp_path / "r"))
        assert code == 1 and "no archive at" in err
        live = flightlog.init(output_dir=tmp_path / "live", run_name="live", sinks=["jsonl"], install_signal_handlers=False)
        try:
            code, _, err = call(capsys, "archive", "live", str(tmp_path / "vault"))
            assert code == 1 and "still running" in err
        finally:
            live.finish()


class TestPythonApi:
    def test_runs_list_and_frame(self, runs):
        """flightlog.runs(where=...) returns dicts or a DataFrame with param./best./final. columns."""
        found = flightlog.runs(where="lora_rank>=32", sort="lora_rank")
        assert [r["name"] for r in found] == ["lora-r32", "lora-r64"]
        assert found[0]["params"]["lora_alpha"] == 64 and found[0]["best"]["eval_accuracy"]["value"] == 0.8
        frame = flightlog.runs(sort="-best.eval_accuracy", as_frame=True)
        assert frame["name"].tolist() == ["lora-r64", "lora-r32", "lora-r8"]
        assert frame["param.lora_rank"].tolist() == [64, 32, 8]
        assert frame["best.eval_accuracy"].tolist() == [0.88, 0.8, 0.64]

    def test_import_stays_light(self):
        """import flightlog loads neither pandas, polars nor sqlite3."""
        code = "import sys, flightlog; print(sorted(m for m in ('pandas', 'polars', 'sqlite3', 'pyarrow') if m in sys.modules))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=60)
        assert out.stdout.strip() == "[]", out.stderr
