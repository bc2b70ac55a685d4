"""Helpers shared by the run-store commands: open the index, find a run, print tables.

Errors become one line on stderr and a non-zero exit code (``CommandError``), never a
traceback: a mistyped run name or ``--where`` is an everyday event.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence, TextIO


class CommandError(Exception):
    """A user-facing failure: the message is printed, the command exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def fail(exc: BaseException | str, code: int = 1) -> int:
    print(f"flightlog: error: {exc}", file=sys.stderr)
    return code


def run_command(body: Any, args: Any) -> int:
    """Call ``body(args)``, turning the store's known errors into messages and exit codes."""
    from flightlog.store.index import IndexUnavailable, RunNotFound
    from flightlog.store.where import WhereError

    try:
        return int(body(args) or 0)
    except CommandError as exc:
        return fail(exc, exc.code)
    except WhereError as exc:
        return fail(f"bad --where expression: {exc}", 2)
    except RunNotFound as exc:
        return fail(exc, 1)
    except IndexUnavailable as exc:
        return fail(exc, 1)
    except FileNotFoundError as exc:
        return fail(exc, 1)


def open_index(create: bool = False) -> Any:
    from flightlog.store.index import RunIndex

    return RunIndex(create=create)


def run_dir_of(ref: str) -> Path | None:
    """A run's log folder when ``ref`` is a path to one (or to its output dir)."""
    path = Path(ref)
    for candidate in (path, path / "logs"):
        if (candidate / "run.json").is_file():
            return candidate
    return None


def find_run(ref: str) -> dict[str, Any]:
    """The index's record of a run named by id, id prefix, name, or path (indexed on the way)."""
    from flightlog.store.entry import entry_from_run_dir
    from flightlog.store.index import RunIndex

    folder = run_dir_of(ref)
    if folder is not None:
        entry = entry_from_run_dir(folder)
        with RunIndex() as index:
            index.upsert(entry)
            return index.get(entry["run_id"])
    with open_index() as index:
        return index.get(ref)


# ---------------------------------------------------------------------- formatting
def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        import orjson

        return orjson.dumps(value).decode()
    return str(value)


def fmt_duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or seconds != seconds:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO | None = None, title: str | None = None) -> None:
    """A rich table on a terminal; plain aligned columns otherwise (pipes, files, tests)."""
    out = out or sys.stdout
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    import shutil

    fits = sum(widths) + 3 * len(widths) + 1 <= shutil.get_terminal_size().columns
    if out.isatty() and fits:  # a table rich would have to fold: plain columns read better
        try:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=title, header_style="bold")
            for h in headers:
                table.add_column(h, no_wrap=True)
            for row in rows:
                table.add_row(*row)
            Console(file=out).print(table)
            return
        except ImportError:
            pass
    if title:
        print(title, file=out)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), file=out)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
