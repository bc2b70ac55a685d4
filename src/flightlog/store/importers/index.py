"""Index entries for folders other tools wrote (``flightlog index DIR`` on ms-swift/HF runs).

The run index's scan hands each foreign folder here; the best importable source in it
(see :func:`detect_formats`) is read once and summarised like a flightlog run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flightlog.store.entry import entry_from_records
from flightlog.store.importers import detect_formats


def index_entry(folder: Path) -> dict[str, Any] | None:
    """The index entry for ``folder``, or None when nothing in it can be imported."""
    here = Path(folder).resolve()
    # Only sources in this folder itself: sub-folders are scanned on their own.
    found = [d for d in detect_formats(folder) if here in (d.path.resolve(), d.path.resolve().parent)]
    if not found:
        return None
    best = found[0]
    return entry_from_records(list(best.open().records()), folder, source=best.format)
