"""Nothing is lost: SIGKILL at random moments, SIGTERM, and interpreter exit."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flightlog.runfile import read_run_file

FLUSH_INTERVAL = 0.25
# A record must be on disk once it is one flush interval old; this much extra is allowed
# for the writer thread to be scheduled on a loaded 2-core machine.
SCHEDULING_SLACK = 0.25

CHILD = textwrap.dedent(
    """
    import sys, time, flightlog
    run = flightlog.init(output_dir=sys.argv[1], sinks=["jsonl"], flush_interval=float(sys.argv[2]),
                         install_signal_handlers=False, compress=sys.argv[3] == "gz")
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        run.log({"loss": 1.0 / step, "t": time.time(), "payload": "x" * (step % 200)}, step=step)
        time.sleep(0.0002)
    """
)


def lines_of(log_dir: Path) -> list[bytes]:
    from flightlog.store.reader import read_bytes, stream_files

    data = b"".join(read_bytes(p) for p in stream_files(log_dir))
    return data.split(b"\n")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "gz"])
def test_sigkill_at_random_moments(tmp_path, mode):
    """12 kills per mode (24 in all): every record older than a flush interval is on disk,
    and every line but a torn last one parses with json and jq."""
    rng = random.Random(1234 if mode == "plain" else 4321)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    jq = shutil.which("jq")
    for trial in range(12):
        out = tmp_path / f"{mode}-{trial}"
        child = subprocess.Popen([sys.executable, str(script), str(out), str(FLUSH_INTERVAL), mode], stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == b"ready"
        started = time.time()
        time.sleep(rng.uniform(0.05, 1.0))
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        lines = lines_of(out / "logs")
        last = lines.pop()  # after the final newline: b"" or a torn line
        records = [json.loads(line) for line in lines if line]  # every complete line parses
        if last:
            with pytest.raises(ValueError):
                json.loads(last)  # only a torn line may be left without its newline
        metrics = [r for r in records if r["type"] == "metrics"]
        steps = [r["step"] for r in metrics]
        assert steps == list(range(1, len(steps) + 1)), "records on disk must be a gap-free prefix"
        deadline = killed_at - FLUSH_INTERVAL - SCHEDULING_SLACK
        written_until = metrics[-1]["t"] if metrics else 0.0
        # Every record logged before the deadline is there: the last one on disk is newer.
        assert written_until >= deadline or started >= deadline, (
            f"trial {trial}: newest record on disk is {killed_at - written_until:.3f}s older than the kill"
        )
        if jq and lines:
            complete = b"\n".join(lines) + b"\n"
            subprocess.run([jq, "-c", "."], input=complete, stdout=subprocess.DEVNULL, check=True)


def _run_child(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=60)


def test_sigterm_flushes_and_marks_interrupted(tmp_path):
    """SIGTERM: the handler flushes everything, marks the run interrupted, then the process dies of SIGTERM."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(
        """
        import sys, time, flightlog
        run = flightlog.init(output_dir=sys.argv[1], sinks=["jsonl"], flush_interval=30)
        for step in range(1, 1001):
            run.log({"loss": 1.0}, step=step)
        print("ready", flush=True)
        time.sleep(60)
        """
    ))
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out")], stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"ready"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM
    log_dir = tmp_path / "out" / "logs"
    meta = read_run_file(log_dir)
    assert meta["status"] == "interrupted"
    records = [json.loads(line) for line in (log_dir / "train.jsonl").read_bytes().splitlines()]
    assert sum(r["type"] == "metrics" for r in records) == 1000  # flush interval was 30 s: the handler flushed
    assert any(r["type"] == "event" and "received SIGTERM" in r["message"] for r in records)
    assert records[-1]["type"] == "run_end" and records[-1]["status"] == "interrupted"


def test_exit_without_finish_flushes(tmp_path):
    """A script that never calls finish still gets every record written and status finished."""
    result = _run_child(tmp_path, """
        import sys, flightlog
        run = flightlog.init(output_dir=sys.argv[1], sinks=["jsonl"], flush_interval=30, rules=False)
        for step in range(1, 501):
            run.log({"loss": 1.0}, step=step)
    """)
    assert result.returncode == 0, result.stderr
    meta = read_run_file(tmp_path / "out" / "logs")
    assert meta["status"] == "finished" and meta["records_written"] == 502


def test_uncaught_exception_marks_failed(tmp_path):
    """A script dying of an exception leaves status failed and a CRITICAL event with the error."""
    result = _run_child(tmp_path, """
        import sys, flightlog
        run = flightlog.init(output_dir=sys.argv[1], sinks=["jsonl"])
        run.log({"loss": 1.0}, step=1)
        raise RuntimeError("CUDA out of memory (simulated)")
    """)
    assert result.returncode == 1 and "CUDA out of memory" in result.stderr
    log_dir = tmp_path / "out" / "logs"
    assert read_run_file(log_dir)["status"] == "failed"
    events = [json.loads(l) for l in (log_dir / "train.jsonl").read_bytes().splitlines()]
    assert any(e.get("level") == "CRITICAL" and "RuntimeError: CUDA out of memory" in e.get("message", "") for e in events)


def test_durable_soon_after_finish(tmp_path):
    """finish() returns with every record on disk and fsynced (fsync=finish)."""
    import flightlog

    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, flush_interval=10, rules=False)
    for step in range(1, 10001):
        run.log({"loss": 1.0}, step=step)
    start = time.perf_counter()
    run.finish()
    elapsed = time.perf_counter() - start
    count = sum(1 for _ in (run.log_dir / "train.jsonl").open("rb"))
    assert count == 10002 and elapsed < 5.0
