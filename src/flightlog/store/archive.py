"""Archiving a run to any fsspec URL (local path, s3://, oss://, memory://) as one tar.gz.

The archive is verified by restoring it (every file's SHA-256 against the source)
before the index points at it; an archive that fails verification is deleted. The
tar holds ``RUN_ID/logs/...`` (and ``RUN_ID/checkpoint-N/...`` when asked), so a
restore recreates the usual layout under any folder.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ArchiveError(RuntimeError):
    """The archive could not be written, read or verified."""


@dataclass
class Archived:
    url: str
    bytes: int
    files: dict[str, str] = field(default_factory=dict)  # member name -> sha256


def _fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is in the archive extra
        raise ArchiveError("archiving needs fsspec: pip install 'flightlog[archive]'") from exc
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise ArchiveError(f"cannot open {url!r}: {exc} (install the fsspec backend for this URL, e.g. s3fs or ossfs)") from exc


def archive_url(dest: str, run_id: str) -> str:
    """``dest`` itself when it names a .tar.gz, else ``dest/RUN_ID.tar.gz``."""
    if dest.endswith((".tar.gz", ".tgz")):
        return dest
    return dest.rstrip("/") + f"/{run_id}.tar.gz"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _members(run_id: str, log_dir: Path, checkpoints: list[str]) -> list[tuple[str, Path]]:
    members = []
    for root, folders in ((log_dir, f"{run_id}/logs"), *((Path(c), f"{run_id}/{Path(c).name}") for c in checkpoints)):
        for dirpath, _, filenames in os.walk(root):
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # run.json being rewritten
                members.append((f"{folders}/{path.relative_to(root).as_posix()}", path))
    return members


def archive_run(run_id: str, log_dir: str | os.PathLike[str], dest: str, checkpoints: list[str] = ()) -> Archived:  # type: ignore[assignment]
    """Write ``RUN_ID.tar.gz`` to ``dest``, verify it by restoring, and return where it is."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        raise ArchiveError(f"the logs of run {run_id} are not at {log_dir}")
    url = archive_url(dest, run_id)
    fs, path = _fs(url)
    members = _members(run_id, log_dir, list(checkpoints))
    hashes = {name: _sha256(src) for name, src in members}
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    try:
        if parent:
            fs.makedirs(parent, exist_ok=True)
        with fs.open(path, "wb") as fh:
            with tarfile.open(fileobj=fh, mode="w:gz", compresslevel=6) as tar:
                for name, src in members:
                    tar.add(src, arcname=name, recursive=False)
    except OSError as exc:
        raise ArchiveError(f"cannot write {url}: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="flightlog-verify-") as tmp:
        try:
            restore(url, tmp)
            bad = [n for n, h in hashes.items() if not (Path(tmp) / n).is_file() or _sha256(Path(tmp) / n) != h]
        except ArchiveError:
            bad = ["(unreadable archive)"]
        if bad:
            try:
                fs.rm(path)
            except OSError:
                pass
            raise ArchiveError(f"the archive at {url} did not verify ({', '.join(bad[:3])} differ); it was removed")
    size = fs.size(path)
    return Archived(url=url, bytes=int(size or 0), files=hashes)


def restore(url: str, target: str | os.PathLike[str]) -> Path:
    """Unpack an archive under ``target``; returns the run's restored log folder."""
    fs, path = _fs(url)
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    try:
        with fs.open(path, "rb") as fh:
            with tarfile.open(fileobj=fh, mode="r:gz") as tar:
                names = tar.getnames()
                tar.extractall(target, filter="data")
    except FileNotFoundError as exc:
        raise ArchiveError(f"no archive at {url}") from exc
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise ArchiveError(f"cannot read the archive {url}: {exc}") from exc
    top = names[0].split("/", 1)[0] if names else ""
    return target / top / "logs"
