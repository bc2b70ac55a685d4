"""Launch record, resume.sh, ``flightlog resume`` and the continuity check (in process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import flightlog
from flightlog.checkpoint.atomic import CheckpointWriter
from flightlog.checkpoint.continuity import ContinuityCheck, metric_series, visible_records
from flightlog.checkpoint.resume import LAUNCH_FILE, record_launch, resume_command, with_resume_arg
from flightlog.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def ckpt(root: Path, step: int) -> None:
    writer = CheckpointWriter(root / f"checkpoint-{step}", step=step)
    writer.write_bytes("trainer_state.json", json.dumps({"global_step": step}).encode())
    writer.commit()


class TestResumeCommand:
    def test_resume_arg_is_set_to_latest_valid(self, tmp_path: Path) -> None:
        """An ms-swift style command gets --resume_from_checkpoint set to the newest valid checkpoint, replacing a stale one."""
        argv = ["swift", "sft", "--model", "m", "--resume_from_checkpoint", "old/checkpoint-1", "--max_steps", "500"]
        record_launch(tmp_path, resume_arg="--resume_from_checkpoint", argv=argv)
        for step in (100, 200):
            ckpt(tmp_path, step)
        (tmp_path / "checkpoint-300").mkdir()  # an interrupted save
        command, launch, found, skipped = resume_command(tmp_path)
        assert found == tmp_path / "checkpoint-200"
        assert command[-2:] == ["--resume_from_checkpoint", str((tmp_path / "checkpoint-200").resolve())]
        assert "old/checkpoint-1" not in command and command.count("--max_steps") == 1
        assert [v.path.name for v in skipped] == ["checkpoint-300"]

    def test_with_resume_arg_forms(self) -> None:
        """Both '--opt X' and '--opt=X' are replaced."""
        assert with_resume_arg(["a", "--r=1", "b", "--r", "2"], "--r", "3") == ["a", "b", "--r", "3"]
        assert with_resume_arg(["a"], "--r", None) == ["a"]

    def test_secrets_are_not_recorded(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Environment variables that look like secrets never reach the launch record."""
        monkeypatch.setenv("FLIGHTLOG_API_TOKEN", "sekret")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        record_launch(tmp_path, argv=["train.py"])
        text = (tmp_path / LAUNCH_FILE).read_text() + (tmp_path / "resume.sh").read_text()
        assert "sekret" not in text and '"CUDA_VISIBLE_DEVICES": "0,1"' in text

    def test_cli_prints_and_runs(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`flightlog resume DIR` prints the command; with --run it executes it (here a python one-liner)."""
        marker = tmp_path / "ran.txt"
        code = f"import sys; open({str(marker)!r}, 'w').write(' '.join(sys.argv[1:]))"
        record_launch(tmp_path, resume_arg="--resume_from_checkpoint", argv=["-c", code])
        ckpt(tmp_path, 7)
        assert cli_main(["resume", str(tmp_path)]) == 0
        out = capsys.readouterr()
        assert "checkpoint-7" in out.out and "resuming from" in out.err
        proc = subprocess.run(["bash", str(tmp_path / "resume.sh"), "--extra"], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        assert marker.read_text() == f"--resume_from_checkpoint {(tmp_path / 'checkpoint-7').resolve()} --extra"

    def test_cli_without_launch_record(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Without a launch record the command fails with a message that says how to get one."""
        assert cli_main(["resume", str(tmp_path)]) == 1
        assert "did not record its launch command" in capsys.readouterr().err

    def test_bad_resume_arg(self, tmp_path: Path) -> None:
        """resume_arg must be an option."""
        with pytest.raises(ValueError, match="resume_arg"):
            record_launch(tmp_path, resume_arg="resume_from_checkpoint")


class TestContinuity:
    def _segment(self, out: Path, losses: dict[int, float], resumed: int | None, check: bool = False):
        run = flightlog.init(output_dir=str(out), sinks=["jsonl"], resumed_from_step=resumed, install_signal_handlers=False)
        checker = ContinuityCheck.attach(run, resumed_from_step=resumed, steps=5) if check else None
        for step, loss in losses.items():
            run.log({"loss": loss}, step=step)
        run.finish()
        return checker

    @pytest.mark.parametrize(
        ("delta", "verdict"), [(0.0, "exact"), (1e-6, "within_tolerance"), (0.5, "diverged")]
    )
    def test_verdicts(self, tmp_path: Path, delta: float, verdict: str) -> None:
        """The first losses after a resume are compared with the superseded ones: exact, within tolerance, diverged."""
        first = {s: 1.0 / s for s in range(1, 21)}
        self._segment(tmp_path, first, None)
        resumed = {s: first[s] + (delta if s == 8 else 0.0) for s in range(6, 15)}
        checker = self._segment(tmp_path, resumed, 5, check=True)
        assert checker.result["continuity"] == verdict
        events = [r for r in visible_records(tmp_path / "logs") if r.get("source") == "flightlog/continuity"]
        assert len(events) == 1 and events[0]["continuity"] == verdict and events[0]["compared"] == 5
        if verdict == "diverged":
            assert events[0]["diverged_at"] == 8 and events[0]["level"] == "WARNING"
        assert metric_series(tmp_path / "logs") == {**{s: first[s] for s in range(1, 6)}, **resumed}  # 15..20 superseded

    def test_partial_window_reported_at_run_end(self, tmp_path: Path) -> None:
        """A resumed segment that ends before k steps still reports on the steps it had."""
        self._segment(tmp_path, {s: float(s) for s in range(1, 10)}, None)
        checker = self._segment(tmp_path, {6: 6.0, 7: 7.0}, 5, check=True)
        assert checker.result == {"continuity": "exact", "compared": 2, "max_abs_diff": 0.0, "max_rel_diff": 0.0}

    def test_torn_last_line_is_skipped(self, tmp_path: Path) -> None:
        """A line cut by a kill does not break the reader."""
        self._segment(tmp_path, {1: 1.0, 2: 2.0}, None)
        with open(tmp_path / "logs" / "train.jsonl", "ab") as fh:
            fh.write(b'{"type":"metrics","step":3,"lo')
        assert metric_series(tmp_path / "logs") == {1: 1.0, 2: 2.0}
