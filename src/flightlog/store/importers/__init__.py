"""Importers: other tools' training logs read as log-protocol records, live or after the fact.

    from flightlog.store.importers import detect_formats
    for found in detect_formats("output"):
        for record in found.open().records():   # or .follow() on a live run
            ...

Formats: ms-swift ``logging.jsonl`` (:mod:`.swift`), HF ``trainer_state.json``
(:mod:`.hf`), TensorBoard event files (:mod:`.tensorboard`), text logs through
templates (:mod:`.text`). Importers only read; they never write, lock or move the
files they read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from flightlog.store.importers.base import ImportStats, Importer, Record

FORMATS = ("ms-swift", "tensorboard", "text", "hf")
TEXT_SUFFIXES = (".log", ".txt", ".out")
SNIFF_BYTES = 64 * 1024
MAX_DEPTH = 3

__all__ = ["Detected", "FORMATS", "ImportStats", "Importer", "Record", "detect_formats", "open_importer"]


@dataclass(frozen=True)
class Detected:
    """One importable source found in an output directory."""

    format: str
    path: Path
    live: bool = True
    """False for sources written only now and then (HF's trainer_state.json: at checkpoints)."""
    options: dict[str, Any] = field(default_factory=dict, compare=False)

    def open(self, **options: Any) -> Importer:
        return open_importer(self.format, self.path, **{**self.options, **options})


def open_importer(fmt: str, path: str | os.PathLike[str], *, patterns: Iterable[str] = (), **options: Any) -> Importer:
    """The importer for ``fmt`` (one of :data:`FORMATS`) reading ``path``."""
    if fmt == "ms-swift":
        from flightlog.store.importers.swift import SwiftImporter

        return SwiftImporter(path)
    if fmt == "hf":
        from flightlog.store.importers.hf import TrainerStateImporter

        return TrainerStateImporter(path)
    if fmt == "tensorboard":
        from flightlog.store.importers.tensorboard import TensorBoardImporter

        return TensorBoardImporter(path)
    if fmt == "text":
        from flightlog.store.importers.text import TextImporter

        return TextImporter(path, patterns=patterns, **options)
    raise ValueError(f"flightlog: unknown import format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _walk(root: Path, exclude: set[Path], depth: int = 0) -> Iterable[Path]:
    """Directories under ``root`` (itself first), at most MAX_DEPTH deep, skipping ``exclude``."""
    if root.resolve() in exclude:
        return
    yield root
    if depth >= MAX_DEPTH:
        return
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return
    for child in children:
        if child.name.startswith("checkpoint-"):
            continue  # checkpoints hold weights, not logs (trainer_state.json is found separately)
        yield from _walk(child, exclude, depth + 1)


def _is_flightlog_run(directory: Path) -> bool:
    return (directory / "run.json").is_file() and (directory / "train.jsonl").exists()


def _newest_mtime(paths: Iterable[Path]) -> float:
    times = []
    for p in paths:
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


def _sniff_text(path: Path) -> bool:
    from flightlog.store.importers.text import DICT_LINE, EVENT_LINE, STEP_LINE

    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    for line in head.replace("\r", "\n").splitlines():
        line = line.strip()
        if STEP_LINE.match(line) and "|" in line or EVENT_LINE.match(line):
            return True
        if DICT_LINE.match(line) and ("'loss'" in line or "'global_step/max_steps'" in line):
            return True
    return False


def detect_formats(
    output_dir: str | os.PathLike[str],
    *,
    all_versions: bool = False,
    exclude: Iterable[str | os.PathLike[str]] = (),
) -> list[Detected]:
    """The importable sources in a trainer's output directory, best first.

    Order: ms-swift ``logging.jsonl`` (newest ``v{N}-{timestamp}`` folder, or every one
    with ``all_versions``), TensorBoard event directories (newest, or all), text logs,
    HF ``trainer_state.json`` (last: the Trainer writes it only at checkpoints).
    flightlog's own run directories and ``exclude`` are skipped.
    """
    from flightlog.store.importers.hf import state_files
    from flightlog.store.importers.swift import version_dirs
    from flightlog.store.importers.tensorboard import event_files

    root = Path(output_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"flightlog: {str(root)!r} is not a directory")
    skip = {Path(p).resolve() for p in exclude}
    found: list[Detected] = []

    swift = [root] if (root / "logging.jsonl").is_file() else []
    versions = [d for d in version_dirs(root) if (d / "logging.jsonl").is_file()]
    if versions:
        swift.extend(versions if all_versions else versions[-1:])
    found.extend(Detected("ms-swift", d / "logging.jsonl") for d in swift if d.resolve() not in skip)

    tb_dirs = []
    text_files = []
    for directory in _walk(root, skip):
        if _is_flightlog_run(directory):
            continue
        files = event_files(directory)
        if files:
            tb_dirs.append((_newest_mtime(files), directory))
        if directory == root or directory.name == "logs":
            try:
                candidates = sorted(p for p in directory.iterdir() if p.suffix in TEXT_SUFFIXES and p.is_file())
            except OSError:
                candidates = []
            text_files.extend(p for p in candidates if _sniff_text(p))
    tb_dirs.sort()
    for _, directory in (tb_dirs if all_versions else tb_dirs[-1:]):
        found.append(Detected("tensorboard", directory))
    found.extend(Detected("text", p) for p in text_files)
    if state_files(root):
        found.append(Detected("hf", root, live=False))
    return found
