"""Checkpoints that a killed run resumes from exactly.

- :mod:`~flightlog.checkpoint.manager`: ``CheckpointManager`` for plain PyTorch loops.
- :mod:`~flightlog.checkpoint.atomic`: temp dir, fsync, manifest written last, rename.
- :mod:`~flightlog.checkpoint.find`: ``find_latest_valid`` (skips partial/corrupt ones, says why).
- :mod:`~flightlog.checkpoint.retention`: ``save_total_limit`` keeping best, latest, resumed-from.
- :mod:`~flightlog.checkpoint.resume`: launch record, ``resume.sh``, ``flightlog resume``.
- :mod:`~flightlog.checkpoint.continuity`: first losses after a resume vs. the superseded ones.
- :mod:`~flightlog.checkpoint.hf`: HF Trainer callback and ``resume_from_checkpoint`` helper.

Importing this package does not import torch; the manager imports it when used.
"""

from __future__ import annotations

from typing import Any

from flightlog.checkpoint.atomic import seal, verify_manifest
from flightlog.checkpoint.find import Verdict, find_latest_valid, validate, validate_all
from flightlog.checkpoint.resume import record_launch, resume_command
from flightlog.checkpoint.retention import apply_retention


def __getattr__(name: str) -> Any:
    if name in ("CheckpointManager", "Position"):
        from flightlog.checkpoint import manager

        return getattr(manager, name)
    if name == "EpochSampler":
        from flightlog.checkpoint.data import EpochSampler

        return EpochSampler
    if name in ("ContinuityCheck", "metric_series", "visible_records"):
        from flightlog.checkpoint import continuity

        return getattr(continuity, name)
    raise AttributeError(f"module 'flightlog.checkpoint' has no attribute {name!r}")


__all__ = [
    "CheckpointManager",
    "ContinuityCheck",
    "EpochSampler",
    "Position",
    "Verdict",
    "apply_retention",
    "find_latest_valid",
    "metric_series",
    "record_launch",
    "resume_command",
    "seal",
    "validate",
    "validate_all",
    "verify_manifest",
    "visible_records",
]
