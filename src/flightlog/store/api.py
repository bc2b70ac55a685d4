"""``flightlog.runs(where=...)``: the run index from Python, as dicts or a DataFrame."""

from __future__ import annotations

from typing import Any


def runs(where: str | None = None, sort: Any = None, limit: int | None = None, as_frame: bool = False) -> Any:
    from flightlog.store.index import RunIndex

    with RunIndex(create=False) as index:
        rows = index.query(where, sort=sort, limit=limit, full=True)
    for row in rows:
        for key in list(row):
            if key not in ("params", "best", "final") and key not in _RUN_KEYS:
                del row[key]  # values of fields named in where/sort are already in params/best/final
    if not as_frame:
        return rows
    import pandas as pd

    flat = []
    for row in rows:
        item = {k: v for k, v in row.items() if k not in ("params", "best", "final")}
        item.update({f"param.{k}": v for k, v in row["params"].items()})
        item.update({f"best.{k}": v["value"] for k, v in row["best"].items()})
        item.update({f"final.{k}": v for k, v in row["final"].items()})
        flat.append(item)
    return pd.DataFrame(flat)


_RUN_KEYS = frozenset(
    ("run_id", "name", "model", "task", "dataset", "status", "start", "end", "duration", "steps", "source", "output_dir", "log_dir", "archive")
)
