"""Checkpoints and exact resume, with a real CPU training killed by SIGKILL.

The training script is tests/ckpt_train.py, run as a subprocess. Kill points are drawn
from a seeded generator (the seed is in the failure message) so a failure reproduces.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flightlog.checkpoint import find_latest_valid, metric_series, validate_all, visible_records
from flightlog.checkpoint.atomic import MANIFEST

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "ckpt_train.py"
STEPS, SAVE = 40, 5
SEED = int(os.environ.get("FLIGHTLOG_TEST_SEED", "20261130"))
# Stages reported by the writer during one save of ckpt_train.py: 7 files, manifest, rename.
SAVE_STAGES = 9


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def launch(out: Path, *args: str) -> list[str]:
    return ["--output-dir", str(out), "--steps", str(STEPS), "--save-steps", str(SAVE), *args]


def chain(tmp_path: Path, launches: list[list[str]]) -> list[dict]:
    """Run the launches one after another (forked from one process that imported torch
    once) and return how each ended and what a resume would have picked after it."""
    plan, report = tmp_path / "plan.json", tmp_path / "report.json"
    plan.write_text(json.dumps(launches))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--chain", str(plan), str(report)], env=env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(report.read_text())


def killed(entry: dict) -> bool:
    return entry["signal"] == signal.SIGKILL


def train(out: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *launch(out, *args)], env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def assert_same_final(a: Path, b: Path) -> None:
    x, y = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    for key in x["model"]:
        assert torch.equal(x["model"][key], y["model"][key]), f"parameter {key} differs"
    for pid, state in x["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, y["optimizer"]["state"][pid][name]), f"optimizer state {pid}.{name} differs"
    assert x["scaler"] == y["scaler"]
    assert x["sched"] == y["sched"]


def loaded_losses(logs: Path) -> dict[int, float]:
    """The loss series as the store's superseded-aware loader (flightlog.load) returns it."""
    import flightlog

    frame = flightlog.load(logs)
    metrics = frame[frame["type"] == "metrics"]
    assert metrics["step"].is_unique, "a step appears twice in the loaded run"
    return dict(zip(metrics["step"].astype(int), metrics["loss"]))


def events(out: Path) -> list[dict]:
    return [r for r in visible_records(out / "logs") if r["type"] == "event"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    out = tmp_path_factory.mktemp("baseline")
    train(out / "run", "--final", str(out / "final.pt"))
    return out / "final.pt", metric_series(out / "run" / "logs")


@pytest.mark.slow
def test_sigkill_at_random_steps_resumes_bit_identical(tmp_path: Path, baseline) -> None:
    """SIGKILLs at random steps, each resumed (the last through resume.sh): final weights, optimizer, scaler and the loss series equal the uninterrupted run's, and the log loads as one run without duplicated steps."""
    final, expected = baseline
    rng = random.Random(SEED)
    kills = sorted(rng.sample(range(2, STEPS), 6))
    out = tmp_path / "run"
    report = chain(tmp_path, [launch(out, "--kill-at", str(k)) for k in kills])
    for k, entry in zip(kills, report):
        assert killed(entry), entry
        expect = f"checkpoint-{(k - 1) // SAVE * SAVE}" if k > SAVE else None
        assert entry["latest"] == expect, (SEED, k, entry)
    # The last launch is the one-command resume the seeds ask for.
    proc = subprocess.run(["bash", str(out / "resume.sh"), "--final", str(tmp_path / "final.pt")], env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_final(final, tmp_path / "final.pt")
    assert metric_series(out / "logs") == expected, f"seed {SEED}, kills {kills}"
    assert loaded_losses(out / "logs") == expected
    messages = [e["message"] for e in events(out)]
    resumes = [m for m in messages if m.startswith("Resuming from checkpoint '")]
    assert len(resumes) == 1 + sum(1 for k in kills[:-1] if k > SAVE), messages
    assert any(m.startswith("Loaded state: global_step=") for m in messages)
    verdicts = [e["continuity"] for e in events(out) if "continuity" in e]
    assert verdicts and set(verdicts) == {"exact"}, verdicts

    # The log is one run: superseded duplicates stay on disk, the loaders show each step once.
    raw = [json.loads(line) for line in (out / "logs" / "train.jsonl").read_text().splitlines()]
    raw_steps = [r["step"] for r in raw if r["type"] == "metrics"]
    assert len(raw_steps) > len(set(raw_steps)), "the crashed segments' records after their checkpoint stay on disk"
    assert len({r["run_id"] for r in raw}) == 1
    starts = [r for r in raw if r["type"] == "run_start"]
    resumed = [None] + [(k - 1) // SAVE * SAVE if k > SAVE else 0 for k in kills]
    assert [s["segment"] for s in starts] == list(range(len(kills) + 1))
    assert [s["resumed_from_step"] for s in starts] == resumed


@pytest.mark.slow
def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path: Path, baseline) -> None:
    """Ten SIGKILLs inside a checkpoint save (every stage of it): the previous checkpoint stays intact and is chosen; no partial one is loaded."""
    final, expected = baseline
    rng = random.Random(SEED + 1)
    stages = list(range(1, SAVE_STAGES + 1)) + [rng.randint(1, SAVE_STAGES - 1)]
    rng.shuffle(stages)
    saves, latest = [], SAVE  # kill inside the save at step s; a resume starts from `latest`
    for stage in stages:
        save_step = min(STEPS, latest + SAVE * rng.choice([1, 1, 1, 2]))
        saves.append(save_step)
        latest = save_step if stage == SAVE_STAGES else save_step - SAVE
    out = tmp_path / "run"
    launches = [launch(out, "--kill-in-save", f"{step}:{stage}", *(["--async-save"] if stage % 2 else [])) for step, stage in zip(saves, stages)]
    report = chain(tmp_path, launches)
    for save_step, stage, entry in zip(saves, stages, report):
        assert killed(entry), entry
        if stage < SAVE_STAGES:
            assert entry["latest"] == f"checkpoint-{save_step - SAVE}", (SEED, save_step, stage, entry)
            assert any(e.startswith(f".tmp-checkpoint-{save_step}-") for e in entry["entries"]), "the interrupted save leaves only a hidden temporary directory"
        else:
            assert entry["latest"] == f"checkpoint-{save_step}", (SEED, save_step, stage, entry)
        assert entry["skipped"] == [], "no complete-looking but invalid checkpoint is ever left behind"
    train(out, "--final", str(tmp_path / "final.pt"))
    assert not list(out.glob(".tmp-*")), "leftover temporary directories are swept on the next start"
    assert_same_final(final, tmp_path / "final.pt")
    assert metric_series(out / "logs") == expected
    assert loaded_losses(out / "logs") == expected
    loaded = [r for r in visible_records(out / "logs") if r["type"] == "checkpoint" and r["status"] == "loaded"]
    assert len(loaded) == len(saves)
    assert all(Path(r["path"]).name.startswith("checkpoint-") for r in loaded)


@pytest.mark.slow
def test_async_save_with_retention_resumes_exactly(tmp_path: Path, baseline) -> None:
    """Background saves with save_total_limit=2: kills and resumes stay exact; the resumed-from and best checkpoints survive retention."""
    final, expected = baseline
    out = tmp_path / "run"
    flags = ["--async-save", "--save-total-limit", "2"]
    report = chain(tmp_path, [launch(out, *flags, "--kill-at", "7"), launch(out, *flags, "--kill-at", "23"), launch(out, *flags, "--final", str(tmp_path / "final.pt"))])
    assert [killed(e) for e in report] == [True, True, False] and report[-1]["rc"] == 0, report
    assert_same_final(final, tmp_path / "final.pt")
    assert metric_series(out / "logs") == expected
    names = sorted(p.name for p in out.glob("checkpoint-*"))
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    best = Path(state["best_model_checkpoint"]).name
    assert "checkpoint-20" in names, f"the checkpoint the last segment resumed from was deleted: {names}"
    assert best in names and f"checkpoint-{STEPS}" in names
    assert len(names) <= 3 + (best not in ("checkpoint-20", f"checkpoint-{STEPS}"))
    saved = [r for r in visible_records(out / "logs") if r["type"] == "checkpoint" and r["status"] == "saved"]
    assert saved and all("blocking_seconds" in r for r in saved)


@pytest.mark.slow
def test_ddp_two_ranks_resume_per_rank_rng(tmp_path: Path) -> None:
    """torchrun with 2 gloo ranks (DDP, a shard and own random streams per rank): rank 0 SIGKILLed, the job resumed; per-rank RNG files are written and restored, and the re-run steps repeat the crashed job's losses exactly."""
    def torchrun(out: Path, *args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
               "--output-dir", str(out), "--steps", "12", "--save-steps", "4", *args]
        return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=180)

    out = tmp_path / "run"
    killed_run = torchrun(out, "--kill-at", "7")
    assert killed_run.returncode != 0
    assert find_latest_valid(out)[0].name == "checkpoint-4"
    rng0 = torch.load(out / "checkpoint-4" / "rng_state_0.pth", weights_only=True)
    rng1 = torch.load(out / "checkpoint-4" / "rng_state_1.pth", weights_only=True)
    assert not torch.equal(rng0["cpu"], rng1["cpu"]) and rng0["python"] != rng1["python"]
    assert not (out / "checkpoint-4" / "rng_state.pth").exists()
    weights = torch.load(out / "checkpoint-4" / "pytorch_model.bin", weights_only=True)
    assert not any(k.startswith("module.") for k in weights), "DDP prefix stripped"
    done = torchrun(out)
    assert done.returncode == 0, done.stderr[-3000:]
    # Steps 5-7 were logged (averaged over both ranks) before the kill and again after the
    # resume: identical only if both ranks' random streams and data shards were restored.
    continuity = [e for e in events(out) if "continuity" in e]
    assert [(e["continuity"], e["compared"]) for e in continuity] == [("exact", 3)], continuity
    assert sorted(loaded_losses(out / "logs")) == list(range(1, 13))
    launch_record = json.loads((out / "flightlog_launch.json").read_text())
    assert launch_record["launcher"] == "torchrun" and "--nproc_per_node" in launch_record["argv"], "resume.sh re-runs torchrun, not one worker"
