"""``save_total_limit``: keep the newest checkpoints, the best one, and the one this run
resumed from (if the resumed run goes wrong, that is where you go back to).

Only complete checkpoints (with a manifest) are counted and deleted; a deletion first
renames the directory to a hidden trash name, so a process killed mid-delete never
leaves a half-deleted ``checkpoint-N`` that looks loadable.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from flightlog.checkpoint.atomic import MANIFEST, TRASH_PREFIX, fsync_path
from flightlog.checkpoint.find import list_checkpoints


def plan_retention(output_dir: str | os.PathLike[str], limit: int, keep: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """The checkpoints :func:`apply_retention` would delete, oldest first."""
    if type(limit) is not int or limit < 1:
        raise ValueError(f"flightlog: save_total_limit must be an integer >= 1, got {limit!r}")
    complete = [p for _, p in list_checkpoints(output_dir) if (p / MANIFEST).exists()]
    if not complete:
        return []
    protected = {Path(p).resolve() for p in keep} | {complete[-1].resolve()}
    excess = len(complete) - limit
    doomed = []
    for path in complete:
        if excess <= 0:
            break
        if path.resolve() in protected:
            continue
        doomed.append(path)
        excess -= 1
    return doomed


def apply_retention(output_dir: str | os.PathLike[str], limit: int, keep: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Delete the oldest unprotected checkpoints until at most ``limit`` remain
    (more remain when the protected ones alone exceed it). Returns what was deleted."""
    removed = []
    for path in plan_retention(output_dir, limit, keep):
        trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{os.getpid()}")
        os.replace(path, trash)
        fsync_path(path.parent)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed
