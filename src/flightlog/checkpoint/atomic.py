"""Atomic checkpoint directories: a checkpoint is either complete or invisible.

Files are written into a hidden temporary directory next to the final one, each file
fsynced, then a manifest (every file's size and sha256) is written last, the temporary
directory fsynced and renamed into place, and the parent directory fsynced. A process
killed at any point leaves either the previous state or a complete checkpoint; a
leftover temporary directory is never a candidate for loading and is swept later.
HF Trainer writes its checkpoints in place; :func:`seal` adds the manifest afterwards,
so a checkpoint whose save was interrupted has none and is recognised as partial.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from flightlog.runfile import pid_alive

MANIFEST = "flightlog_manifest.json"
FORMAT = "flightlog-checkpoint"
FORMAT_VERSION = 1
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".deleting-"
HASH_CHUNK = 4 * 1024 * 1024

Progress = Callable[[str], None]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (directory fsync makes renames and new names durable)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def build_manifest(directory: Path, step: int | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    files = {}
    for path in _files(directory):
        files[path.relative_to(directory).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "step": step,
        "created": time.time(),
        "files": files,
        **(extra or {}),
    }


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    tmp = directory / f".{MANIFEST}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / MANIFEST)
    fsync_path(directory)


def seal(directory: str | os.PathLike[str], step: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fsync every file of an existing checkpoint directory and write its manifest last.

    For checkpoints written by someone else (HF Trainer): after ``seal`` the directory
    is verifiable like one of ours. Returns the manifest.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"flightlog: checkpoint directory {str(directory)!r} does not exist")
    for path in _files(directory):
        fsync_path(path)
    manifest = build_manifest(directory, step, extra)
    _write_manifest(directory, manifest)
    return manifest


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        data = orjson.loads((Path(directory) / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def verify_manifest(directory: str | os.PathLike[str], checksums: bool = True) -> str | None:
    """None when the directory matches its manifest; otherwise the reason it does not."""
    directory = Path(directory)
    if not (directory / MANIFEST).exists():
        return f"no {MANIFEST} (the save did not complete)"
    manifest = read_manifest(directory)
    if manifest is None:
        return f"{MANIFEST} is unreadable or not a flightlog manifest"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} lists no files"
    for name, info in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != info.get("bytes"):
            return f"{name} has {size} bytes, the manifest says {info.get('bytes')}"
        if checksums and sha256_file(path) != info.get("sha256"):
            return f"{name} does not match its sha256 in the manifest"
    return None


@dataclass
class Committed:
    path: Path
    bytes: int
    files: int
    seconds: float


class CheckpointWriter:
    """Write one checkpoint atomically: ``write_*`` files, then ``commit``.

    ``progress(stage)`` is called after each file ("file:NAME"), after the manifest
    ("manifest") and after the rename ("renamed"): a progress display, and the place
    where the tests kill the process in the middle of a save.
    """

    def __init__(self, final_dir: str | os.PathLike[str], *, step: int | None = None, progress: Progress | None = None) -> None:
        self.final_dir = Path(final_dir)
        self.step = step
        self.progress = progress
        self.final_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = self.final_dir.parent / f"{TMP_PREFIX}{self.final_dir.name}-{os.getpid()}"
        if self.tmp_dir.exists():
            shutil.rmtree(self.tmp_dir)
        self.tmp_dir.mkdir()
        self._start = time.monotonic()

    def _done(self, stage: str) -> None:
        if self.progress is not None:
            self.progress(stage)

    def write_with(self, name: str, write: Callable[[Path], Any]) -> Path:
        """``write(path)`` creates the file (e.g. ``torch.save(obj, path)``); it is then fsynced."""
        path = self.tmp_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        fsync_path(path)
        self._done(f"file:{name}")
        return path

    def write_bytes(self, name: str, data: bytes) -> Path:
        return self.write_with(name, lambda p: p.write_bytes(data))

    def commit(self, extra: dict[str, Any] | None = None) -> Committed:
        manifest = build_manifest(self.tmp_dir, self.step, extra)
        _write_manifest(self.tmp_dir, manifest)
        self._done("manifest")
        if self.final_dir.exists():
            # Re-saving the same step (after a resume): move the old one aside first.
            trash = self.final_dir.parent / f"{TRASH_PREFIX}{self.final_dir.name}-{os.getpid()}"
            os.replace(self.final_dir, trash)
            os.replace(self.tmp_dir, self.final_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(self.tmp_dir, self.final_dir)
        fsync_path(self.final_dir.parent)
        self._done("renamed")
        total = sum(f["bytes"] for f in manifest["files"].values())
        return Committed(self.final_dir, total, len(manifest["files"]), time.monotonic() - self._start)

    def abort(self) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


def sweep_leftovers(output_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove temporary and half-deleted checkpoint directories left by killed processes.

    Only names we create (``.tmp-*`` / ``.deleting-*``) whose writing process is gone are
    removed; returns what was removed.
    """
    removed = []
    root = Path(output_dir)
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        if not path.is_dir() or not path.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            continue
        pid_text = path.name.rsplit("-", 1)[-1]
        if pid_text.isdigit() and pid_alive(int(pid_text)) and int(pid_text) != os.getpid():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
