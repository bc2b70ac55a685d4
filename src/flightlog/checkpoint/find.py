"""Find the checkpoint to resume from: the newest one that is complete, and say why
the newer ones were skipped.

A checkpoint with a flightlog manifest is valid when every listed file has its size and
sha256. Without a manifest (HF Trainer, ms-swift, a run that knew nothing of flightlog)
it is checked for completeness the way HF Trainer writes it: ``trainer_state.json``
(written last) parses, weights, ``optimizer.pt``, ``scheduler.pt`` and ``rng_state*.pth``
exist and are not truncated. Once any sibling checkpoint carries a manifest, a
checkpoint without one is a save that was interrupted and is rejected.
Reads files only: no torch import.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from flightlog.checkpoint.atomic import MANIFEST, read_manifest, verify_manifest

PREFIX = "checkpoint-"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Verdict:
    """One checkpoint directory and whether it can be resumed from."""

    path: Path
    step: int
    ok: bool
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.path}: " + ("valid" if self.ok else f"rejected: {self.reason}")


def checkpoint_dir(output_dir: str | os.PathLike[str], step: int) -> Path:
    return Path(output_dir) / f"{PREFIX}{step}"


def list_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``checkpoint-N`` directories, oldest first (temporary and trash dirs never match)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return sorted(found)


def _torch_file_problem(path: Path) -> str | None:
    """A torch.save file is a zip archive whose directory is at the end: truncation shows."""
    try:
        size = path.stat().st_size
    except OSError:
        return f"{path.name} is missing"
    if size == 0:
        return f"{path.name} is empty"
    if zipfile.is_zipfile(path):
        return None
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head[:1] == b"\x80":  # legacy (non-zip) pickle format: cannot tell more cheaply
        return None
    return f"{path.name} is truncated or not a torch file"


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > size - 8:
                return f"{path.name} is truncated (header)"
            header = json.loads(fh.read(header_len))
    except (OSError, struct.error, ValueError):
        return f"{path.name} is truncated or not a safetensors file"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        return f"{path.name} is truncated ({size} bytes, needs {8 + header_len + end})"
    return None


def _weights_problem(directory: Path) -> str | None:
    present = [name for name in WEIGHT_FILES if (directory / name).exists()]
    if not present:
        return "no weights (model.safetensors, pytorch_model.bin, adapter_model.*)"
    for name in present:
        path = directory / name
        if name.endswith(".index.json"):
            try:
                shards = set(json.loads(path.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError):
                return f"{name} is unreadable"
            for shard in sorted(shards):
                check = _safetensors_problem if shard.endswith(".safetensors") else _torch_file_problem
                if not (directory / shard).exists():
                    return f"weight shard {shard} is missing"
                if problem := check(directory / shard):
                    return problem
        elif name.endswith(".safetensors"):
            if problem := _safetensors_problem(path):
                return problem
        elif problem := _torch_file_problem(path):
            return problem
    return None


def check_hf_checkpoint(directory: str | os.PathLike[str], step: int | None = None) -> str | None:
    """None when an HF-layout checkpoint has everything a resume needs; else what is missing."""
    directory = Path(directory)
    state_path = directory / TRAINER_STATE
    if not state_path.exists():
        return f"no {TRAINER_STATE} (the save did not complete)"
    try:
        state = json.loads(state_path.read_text())
        global_step = int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{TRAINER_STATE} is unreadable or has no global_step"
    if step is not None and global_step != step:
        return f"{TRAINER_STATE} says global_step={global_step}, the directory name says {step}"
    if problem := _weights_problem(directory):
        return problem
    optimizers = [p for p in directory.iterdir() if p.name == "optimizer.pt" or p.name.startswith("optimizer.pt_") or p.name.endswith("-optimizer.pt") or p.name == "optimizer.bin"]
    if not optimizers:
        return "no optimizer.pt (saved with save_only_model? the training state cannot be restored)"
    for path in optimizers:
        if path.is_file() and (problem := _torch_file_problem(path)):
            return problem
    if not (directory / "scheduler.pt").exists():
        return "no scheduler.pt"
    if problem := _torch_file_problem(directory / "scheduler.pt"):
        return problem
    rng = sorted(directory.glob("rng_state*.pth"))
    if not rng:
        return "no rng_state*.pth"
    for path in rng:
        if problem := _torch_file_problem(path):
            return problem
    return None


def validate(directory: str | os.PathLike[str], *, require_manifest: bool = False, checksums: bool = True) -> Verdict:
    directory = Path(directory)
    m = CHECKPOINT_RE.match(directory.name)
    step = int(m.group(1)) if m else -1
    if not directory.is_dir():
        return Verdict(directory, step, False, "not a directory")
    if (directory / MANIFEST).exists() or require_manifest:
        reason = verify_manifest(directory, checksums=checksums)
        if reason is None:
            manifest = read_manifest(directory) or {}
            if m and manifest.get("step") not in (None, step):
                reason = f"manifest is for step {manifest.get('step')}, the directory name says {step}"
        if reason is None and (directory / TRAINER_STATE).exists():
            reason = check_hf_checkpoint(directory, step if m else None) if _looks_hf(directory) else None
        return Verdict(directory, step, reason is None, reason or "")
    reason = check_hf_checkpoint(directory, step if m else None)
    return Verdict(directory, step, reason is None, reason or "")


def _looks_hf(directory: Path) -> bool:
    """A sealed HF checkpoint (as opposed to a flightlog manager one, which may omit parts)."""
    manifest = read_manifest(directory) or {}
    return manifest.get("writer") == "hf"


def validate_all(output_dir: str | os.PathLike[str], checksums: bool = True) -> list[Verdict]:
    """Every checkpoint in ``output_dir``, newest first, with its verdict."""
    found = list_checkpoints(output_dir)
    sealed = any((p / MANIFEST).exists() for _, p in found)
    return [validate(p, require_manifest=sealed, checksums=checksums) for _, p in reversed(found)]


def find_latest_valid(output_dir: str | os.PathLike[str], checksums: bool = True) -> tuple[Path | None, list[Verdict]]:
    """The newest valid checkpoint (or None) and the verdicts of the newer ones that were skipped."""
    found = list_checkpoints(output_dir)
    sealed = any((p / MANIFEST).exists() for _, p in found)
    skipped: list[Verdict] = []
    for _, path in reversed(found):
        verdict = validate(path, require_manifest=sealed, checksums=checksums)
        if verdict.ok:
            return path, skipped
        skipped.append(verdict)
    return None, skipped
