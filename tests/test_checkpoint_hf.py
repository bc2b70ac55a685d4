"""HF Trainer on a tiny Llama from a config: kill, resume through flightlog, compare with
an uninterrupted run. Also a crash inside HF's in-place save: HF's own choice of
checkpoint picks the broken one, flightlog's does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "hf_train.py"


def hf(out: Path, *args: str, killed: bool = False) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--output-dir", str(out), *args], env=env, capture_output=True, text=True, timeout=300)
    if killed:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_hf_trainer_kill_and_resume_is_exact(tmp_path: Path) -> None:
    """Killed at step 6 and inside the save of step 8 (gradient accumulation 2, dropout, cosine schedule): the resumed losses and final weights equal the uninterrupted run's."""
    import torch
    from transformers.trainer_utils import get_last_checkpoint

    from flightlog.checkpoint import find_latest_valid, metric_series, visible_records
    from flightlog.store.reader import tagged_records

    hf(tmp_path / "base", "--final", str(tmp_path / "base.pt"))
    out = tmp_path / "run"
    hf(out, "--kill-at", "6", killed=True)
    hf(out, "--kill-in-save", "8", killed=True)
    assert Path(get_last_checkpoint(str(out))).name == "checkpoint-8", "HF's own choice is the interrupted save"
    latest, skipped = find_latest_valid(out)
    assert latest.name == "checkpoint-4"
    assert skipped[0].path.name == "checkpoint-8" and "flightlog_manifest.json" in skipped[0].reason
    hf(out, "--final", str(tmp_path / "run.pt"))

    base, resumed = torch.load(tmp_path / "base.pt"), torch.load(tmp_path / "run.pt")
    diffs = {k: (base[k] - resumed[k]).abs().max().item() for k in base}
    assert all(torch.equal(base[k], resumed[k]) for k in base), f"max abs weight difference {max(diffs.values())}"
    expected, got = metric_series(tmp_path / "base" / "logs"), metric_series(out / "logs")
    assert got == expected, {s: (expected[s], got.get(s)) for s in expected if expected[s] != got.get(s)}
    import flightlog

    frame = flightlog.load(out / "logs")
    assert frame["step"].is_unique and dict(zip(frame["step"].astype(int), frame["loss"])) == expected

    records = visible_records(out / "logs")
    messages = [r["message"] for r in records if r["type"] == "event"]
    assert messages.count(f"Resuming from checkpoint '{out / 'checkpoint-4'}'") == 2
    assert any(m.startswith("Loaded state: global_step=4, epoch=0.80") for m in messages)
    statuses = [(r["status"], Path(r["path"]).name) for r in records if r["type"] == "checkpoint"]
    assert ("rejected", "checkpoint-8") in statuses and ("loaded", "checkpoint-4") in statuses
    continuity = [r["continuity"] for _, r in tagged_records(out / "logs") if "continuity" in r]
    assert continuity == ["exact", "exact"], continuity  # one per resume (the first is superseded by the second)
    assert all((out / f"checkpoint-{s}" / "flightlog_manifest.json").exists() for s in (4, 8, 12))
