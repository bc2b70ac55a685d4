"""``flightlog index DIR``: find runs in existing output folders and index them.

A flightlog run is a folder holding ``run.json``. Folders written by other tools
(ms-swift's ``logging.jsonl``, HF's ``trainer_state.json``, TensorBoard event files)
are handed to the importers through ``FOREIGN``: each entry names a function
``(folder: Path) -> index entry | None``; an importer builds the entry with
:func:`flightlog.store.entry.entry_from_records` from the records it reads. An importer
that is not installed is skipped and the folder reported, so the scan works with or
without them.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from flightlog.protocol import RUN_FILE

# "module:function" -> entry builder for folders that are not flightlog runs.
FOREIGN: list[str] = [
    "flightlog.store.importers.index:index_entry",
]
# Files that mark a folder written by another tool.
FOREIGN_MARKERS = ("logging.jsonl", "trainer_state.json")
_SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv", "wandb", "mlruns"})


@dataclass
class ScanResult:
    indexed: list[str] = field(default_factory=list)  # run ids
    errors: list[tuple[str, str]] = field(default_factory=list)  # (folder, why)
    foreign_unhandled: list[str] = field(default_factory=list)  # folders no importer took
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (run id, folder not indexed)


def find_run_dirs(root: Path) -> Iterator[tuple[str, Path]]:
    """``("flightlog" | "foreign", folder)`` for every run folder under ``root``.

    Does not descend into ``checkpoint-N`` folders (they hold weights, not logs) or
    into a flightlog run's own folder.
    """
    for dirpath, dirnames, filenames in os.walk(root):
        names = set(filenames)
        here = Path(dirpath)
        if RUN_FILE in names:
            yield "flightlog", here
            dirnames[:] = []
            continue
        if any(m in names for m in FOREIGN_MARKERS) or any(n.startswith("events.out.tfevents") for n in names):
            if not (here / "logs" / RUN_FILE).exists():  # a flightlog run's output dir: its logs/ is the run
                yield "foreign", here
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("checkpoint-"))


def _foreign_builders() -> list[Callable[[Path], Any]]:
    builders = []
    for spec in FOREIGN:
        module_name, _, func = spec.partition(":")
        try:
            builders.append(getattr(importlib.import_module(module_name), func))
        except (ImportError, AttributeError):
            continue
    return builders


def scan(roots: Iterable[str | os.PathLike[str]], index: Any) -> ScanResult:
    """Index every run found under ``roots`` into ``index`` (a :class:`RunIndex`)."""
    from flightlog.store.entry import entry_from_run_dir

    result = ScanResult()
    builders: list[Callable[[Path], Any]] | None = None
    entries = []
    for root in roots:
        path = Path(root)
        if not path.is_dir():
            result.errors.append((str(path), "not a directory"))
            continue
        for kind, folder in find_run_dirs(path):
            try:
                if kind == "flightlog":
                    entries.append(entry_from_run_dir(folder))
                    continue
                builders = _foreign_builders() if builders is None else builders
                entry = next((e for b in builders if (e := b(folder)) is not None), None)
                if entry is None:
                    result.foreign_unhandled.append(str(folder))
                else:
                    entries.append(entry)
            except (ValueError, OSError) as exc:
                result.errors.append((str(folder), str(exc)))
    chosen: dict[str, dict[str, Any]] = {}
    for entry in entries:  # one run in several folders (a copy, a restored archive)
        run_id = entry["run_id"]
        if run_id not in chosen:
            chosen[run_id] = entry
            continue
        current = _indexed_log_dir(index, run_id)
        keep, drop = (entry, chosen[run_id]) if entry.get("log_dir") == current else (chosen[run_id], entry)
        chosen[run_id] = keep
        result.duplicates.append((run_id, str(drop.get("log_dir"))))
    batch = list(chosen.values())
    for i in range(0, len(batch), 200):  # short transactions: a training run's heartbeat waits at most 0.25 s
        index.upsert_many(batch[i : i + 200])
    result.indexed = list(chosen)
    return result


def _indexed_log_dir(index: Any, run_id: str) -> str | None:
    row = index.db.execute("SELECT log_dir FROM runs WHERE run_id=?", (run_id,)).fetchone()
    return row[0] if row else None
