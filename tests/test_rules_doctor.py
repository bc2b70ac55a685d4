"""`flightlog doctor` on finished, crashed and resumed runs, and on records from any source."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import flightlog
from flightlog.cli import main as cli
from flightlog.rules.doctor import diagnose, load_path, render_text

SRC = str(Path(flightlog.__file__).resolve().parents[1])


def spiky_run(out: Path, *, nan_at: int | None = None, rules: Any = False) -> Any:
    """A finished run with a spike at step 150 (rules off while recording: doctor must find it)."""
    run = flightlog.init(output_dir=out, sinks=["jsonl"], install_signal_handlers=False, rules=rules, run_name="spiky")
    for step in range(1, 301):
        loss = 2.0 - step * 0.002 + (0.01 if step % 2 else -0.01) + (1.6 if step == 150 else 0.0)
        if step == nan_at:
            loss = float("nan")
        run.log({"loss": loss, "learning_rate": 1e-4, "eval_accuracy": step / 300}, step=step)
        if step == 200:
            run.checkpoint("saved", out / "checkpoint-200", step=200)
    run.finish()
    return run


def test_finished_run_text_report(tmp_path: Path, capsys: Any) -> None:
    """Replayed rules find the spike; the report says how the run ended, causes, actions, best/last."""
    spiky_run(tmp_path)
    assert cli(["doctor", str(tmp_path)]) == 0  # the output dir; logs/ is found
    text = capsys.readouterr().out
    assert "flightlog doctor: run spiky" in text
    assert "FINISHED: run_end record at step 300" in text
    assert "WARNING loss_spike x1 (first at step 150)" in text
    assert "causes: invalid tokens in the data" in text and "action: clip gradients with --max_grad_norm 1.0" in text
    assert "step 150 WARNING loss_spike" in text
    assert "last checkpoint saved: step 200" in text
    assert "loss: best" in text and "eval_accuracy: best 1 at step 300" in text


def test_json_and_markdown(tmp_path: Path, capsys: Any) -> None:
    """--json is machine-readable (NaN as a string); --markdown has headings and a metrics table."""
    spiky_run(tmp_path, nan_at=250)
    assert cli(["doctor", str(tmp_path / "logs"), "--json"]) == 1  # a critical finding -> exit 1
    report = json.loads(capsys.readouterr().out)
    assert report["ended"] == "finished" and report["last_step"] == 300
    assert [c["rule"] for c in report["causes"]] == ["nonfinite", "loss_spike"]
    nan = next(e for e in report["timeline"] if e["rule"] == "nonfinite")
    assert nan["step"] == 250 and nan["value"] == "NaN" and nan["source"] == "replay"
    assert report["best"]["eval_accuracy"] == {"value": 1.0, "step": 300}
    assert cli(["doctor", str(tmp_path / "logs" / "train.jsonl"), "--markdown"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("# flightlog doctor: run spiky") and "## Likely causes and actions" in md
    assert "| metric | best | at step | last |" in md


def test_live_alerts_are_not_doubled(tmp_path: Path) -> None:
    """With rules on while recording, the spike is in the log once; the replay does not add it again."""
    run = spiky_run(tmp_path, rules=True)
    records, meta, _ = load_path(run.log_dir)
    report = diagnose(records, meta)
    spikes = [e for e in report.timeline if e["rule"] == "loss_spike"]
    assert len(spikes) == 1 and spikes[0]["source"] == "recorded"
    assert "[live alert]" in render_text(report)


def test_crashed_run_and_torn_line(tmp_path: Path, capsys: Any) -> None:
    """A process killed with SIGKILL mid-training: no run_end, its pid is gone -> crashed; a torn
    last line is skipped and counted."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {SRC!r})
        import flightlog
        run = flightlog.init(output_dir={str(tmp_path)!r}, sinks=["jsonl"], flush_interval=0.05, run_name="victim")
        step = 0
        while True:
            step += 1
            run.log({{"loss": 3.0 - step * 1e-3, "grad_norm": 1.0}}, step=step)
            if step == 50:
                print("ready", flush=True)
            time.sleep(0.005)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    with open(tmp_path / "logs" / "train.jsonl", "a") as fh:
        fh.write('{"type": "metrics", "step": 99999, "lo')  # what a crash mid-write leaves
    assert cli(["doctor", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    assert "CRASHED: no run_end record" in text and f"process {proc.pid} is gone" in text
    assert "1 unreadable line(s) skipped" in text and "99999" not in text


def test_resumed_run_hides_superseded_records(tmp_path: Path) -> None:
    """Segment 0 spiked at step 80 and crashed at 100; segment 1 resumed from step 50: the spike
    belongs to lost progress and is not reported."""
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, rules=False)
    for step in range(1, 101):
        run.log({"loss": 2.0 - step * 0.002 + (0.01 if step % 2 else -0.01) + (2.0 if step == 80 else 0.0)}, step=step)
    run.finish("failed")
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, rules=False, resumed_from_step=50)
    for step in range(51, 201):
        run.log({"loss": 2.0 - step * 0.002 + (0.01 if step % 2 else -0.01)}, step=step)
    run.finish()
    records, meta, _ = load_path(tmp_path)
    report = diagnose(records, meta)
    assert [e["rule"] for e in report.timeline] == ["resume"] and report.causes == []
    assert report.ended == "finished" and report.last_step == 200


def test_any_iterable_of_records_plugs_in() -> None:
    """An importer's output (here: HF trainer_state.json log_history turned into records) is enough."""
    log_history = [{"step": s, "loss": 1.5 + (0.01 if s % 2 else -0.01), "learning_rate": 5e-5, "grad_norm": 1e-3, "epoch": s / 100}
                   for s in range(1, 61)]

    def imported() -> Any:
        yield {"type": "run_start", "run_name": "hf-run", "timestamp": "2026-11-30T00:00:00.000Z"}
        for entry in log_history:
            yield {"type": "metrics", "timestamp": f"2026-11-30T00:{entry['step'] // 60:02d}:{entry['step'] % 60:02d}.000Z", **entry}

    report = diagnose(imported())
    assert report.run["run_name"] == "hf-run" and report.ended == "unknown"
    assert [c["rule"] for c in report.causes] == ["grad_vanishing"]
    assert "no run_end record" in report.ended_detail


def test_bad_path(tmp_path: Path, capsys: Any) -> None:
    assert cli(["doctor", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli(["doctor", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "not a flightlog run" in err or "found no" in err


def test_ms_swift_logging_jsonl_through_the_importers(tmp_path: Path, capsys: Any) -> None:
    """With the run store's importers installed, an ms-swift logging.jsonl is diagnosed like a flightlog run."""
    import pytest

    pytest.importorskip("flightlog.store.importers", reason="the run store's importers are another issue's work")
    lines = []
    for step in range(1, 301):
        loss = 2.5 - step * 0.002 + (0.01 if step % 2 else -0.01) + (1.7 if step == 200 else 0.0)
        lines.append(json.dumps({"loss": round(loss, 4), "grad_norm": 1.2, "learning_rate": 1e-4, "memory(GiB)": 14.2,
                                 "epoch": step / 300, "global_step/max_steps": f"{step}/300", "percentage": f"{step / 3:.2f}%",
                                 "elapsed_time": f"{step}s", "remaining_time": "1s"}))
    (tmp_path / "logging.jsonl").write_text("\n".join(lines) + "\n")
    assert cli(["doctor", str(tmp_path / "logging.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "WARNING loss_spike x1 (first at step 200)" in text and "300 metrics records" in text
