"""Atomic writes, validation and retention of checkpoint directories (in process, real files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from flightlog.checkpoint import apply_retention, find_latest_valid, seal, validate, validate_all
from flightlog.checkpoint.atomic import MANIFEST, CheckpointWriter, sweep_leftovers, verify_manifest
from flightlog.checkpoint.find import check_hf_checkpoint


def write_ckpt(root: Path, step: int, payload: bytes = b"x" * 100) -> Path:
    writer = CheckpointWriter(root / f"checkpoint-{step}", step=step)
    writer.write_with("pytorch_model.bin", lambda p: torch.save({"w": torch.arange(4.0) + step}, p))
    writer.write_bytes("blob.bin", payload)
    writer.write_bytes("trainer_state.json", json.dumps({"global_step": step}).encode())
    return writer.commit().path


def hf_like(root: Path, step: int) -> Path:
    """A checkpoint laid out as HF Trainer writes it (real torch files, no manifest)."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    torch.save({"w": torch.zeros(3)}, d / "pytorch_model.bin")
    torch.save({"state": {}, "param_groups": []}, d / "optimizer.pt")
    torch.save({"last_epoch": step}, d / "scheduler.pt")
    torch.save({"cpu": torch.get_rng_state()}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.5}))
    return d


class TestAtomicWriter:
    def test_commit_writes_manifest_last_and_verifies(self, tmp_path: Path) -> None:
        """A committed checkpoint has a manifest whose sizes and sha256 match every file."""
        path = write_ckpt(tmp_path, 5)
        manifest = json.loads((path / MANIFEST).read_text())
        assert set(manifest["files"]) == {"pytorch_model.bin", "blob.bin", "trainer_state.json"}
        assert verify_manifest(path) is None
        assert not list(tmp_path.glob(".tmp-*"))

    def test_abort_leaves_nothing_visible(self, tmp_path: Path) -> None:
        """A save that fails midway leaves no checkpoint-N directory."""
        writer = CheckpointWriter(tmp_path / "checkpoint-3", step=3)
        writer.write_bytes("a.bin", b"123")
        with pytest.raises(RuntimeError):
            writer.write_with("b.bin", lambda p: (_ for _ in ()).throw(RuntimeError("disk full")))
        writer.abort()
        assert list(tmp_path.iterdir()) == []

    def test_resave_same_step_replaces(self, tmp_path: Path) -> None:
        """Saving a step again (after resuming from an earlier one) replaces the old directory whole."""
        write_ckpt(tmp_path, 5, b"old")
        write_ckpt(tmp_path, 5, b"new!")
        assert (tmp_path / "checkpoint-5" / "blob.bin").read_bytes() == b"new!"
        assert validate(tmp_path / "checkpoint-5").ok

    def test_sweep_removes_dead_temp_dirs_only(self, tmp_path: Path) -> None:
        """Leftover temp dirs of dead processes are swept; a live writer's is kept."""
        dead = tmp_path / ".tmp-checkpoint-9-999999999"
        dead.mkdir()
        live = tmp_path / f".tmp-checkpoint-8-{os.getppid()}"
        live.mkdir()
        assert sweep_leftovers(tmp_path) == [dead]
        assert live.exists()


class TestFindLatestValid:
    def test_corruption_is_rejected_with_reason(self, tmp_path: Path) -> None:
        """A flipped byte, a truncated file, a missing file and a missing manifest each reject a checkpoint, with the reason."""
        for step in (5, 10, 15, 20, 25):
            write_ckpt(tmp_path, step)
        blob = tmp_path / "checkpoint-25" / "blob.bin"
        blob.write_bytes(b"y" + blob.read_bytes()[1:])
        weights = tmp_path / "checkpoint-20" / "pytorch_model.bin"
        weights.write_bytes(weights.read_bytes()[:-10])
        (tmp_path / "checkpoint-15" / "blob.bin").unlink()
        (tmp_path / "checkpoint-10" / MANIFEST).unlink()
        latest, skipped = find_latest_valid(tmp_path)
        assert latest == tmp_path / "checkpoint-5"
        reasons = {v.path.name: v.reason for v in skipped}
        assert "sha256" in reasons["checkpoint-25"]
        assert "bytes" in reasons["checkpoint-20"]
        assert "missing" in reasons["checkpoint-15"]
        assert "no flightlog_manifest.json" in reasons["checkpoint-10"]

    def test_nothing_valid(self, tmp_path: Path) -> None:
        """An empty or missing output dir gives None, not an error."""
        assert find_latest_valid(tmp_path / "nope") == (None, [])
        (tmp_path / "checkpoint-3").mkdir()
        latest, skipped = find_latest_valid(tmp_path)
        assert latest is None and "trainer_state.json" in skipped[0].reason

    def test_hf_checkpoint_completeness(self, tmp_path: Path) -> None:
        """Unsealed HF checkpoints are checked file by file; a truncated optimizer or a missing rng file rejects them."""
        good = hf_like(tmp_path, 4)
        assert check_hf_checkpoint(good, 4) is None
        bad = hf_like(tmp_path, 8)
        (bad / "optimizer.pt").write_bytes((bad / "optimizer.pt").read_bytes()[:50])
        assert "optimizer.pt" in check_hf_checkpoint(bad, 8)
        (bad / "optimizer.pt").unlink()
        assert "no optimizer.pt" in check_hf_checkpoint(bad, 8)
        norng = hf_like(tmp_path, 12)
        (norng / "rng_state.pth").unlink()
        assert "rng_state" in check_hf_checkpoint(norng, 12)
        partial = hf_like(tmp_path, 16)
        (partial / "trainer_state.json").unlink()  # HF writes it last: the save was cut short
        latest, skipped = find_latest_valid(tmp_path)
        assert latest == good
        assert [v.path.name for v in skipped] == ["checkpoint-16", "checkpoint-12", "checkpoint-8"]

    def test_sealed_siblings_require_manifest(self, tmp_path: Path) -> None:
        """Once HF checkpoints are sealed, an unsealed newer one is an interrupted save even if it looks complete."""
        seal(hf_like(tmp_path, 4), 4, {"writer": "hf"})
        hf_like(tmp_path, 8)
        verdicts = validate_all(tmp_path)
        assert [(v.path.name, v.ok) for v in verdicts] == [("checkpoint-8", False), ("checkpoint-4", True)]

    def test_step_mismatch(self, tmp_path: Path) -> None:
        """trainer_state.json's global_step must match the directory name."""
        d = hf_like(tmp_path, 4)
        d.rename(tmp_path / "checkpoint-6")
        assert "global_step=4" in validate(tmp_path / "checkpoint-6").reason


class TestRetention:
    def test_keeps_latest_best_and_resumed(self, tmp_path: Path) -> None:
        """save_total_limit=2 deletes the oldest, never the best, the resumed-from or the latest."""
        for step in range(5, 45, 5):
            write_ckpt(tmp_path, step)
        removed = apply_retention(tmp_path, 2, keep=[tmp_path / "checkpoint-10", tmp_path / "checkpoint-25"])
        left = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
        assert left == [10, 25, 40]
        assert sorted(p.name for p in removed) == ["checkpoint-15", "checkpoint-20", "checkpoint-30", "checkpoint-35", "checkpoint-5"]
        assert not list(tmp_path.glob(".deleting-*"))

    def test_unsealed_dirs_are_not_counted_or_deleted(self, tmp_path: Path) -> None:
        """Directories without a manifest (not ours, or interrupted) are left alone."""
        hf_like(tmp_path, 1)
        for step in (5, 10, 15):
            write_ckpt(tmp_path, step)
        apply_retention(tmp_path, 1)
        assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-15"]

    def test_bad_limit(self, tmp_path: Path) -> None:
        """A limit below 1 is refused with a message naming it."""
        with pytest.raises(ValueError, match="save_total_limit"):
            apply_retention(tmp_path, 0)
