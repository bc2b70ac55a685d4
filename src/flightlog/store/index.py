"""The run index: one SQLite file (WAL) under ``FLIGHTLOG_HOME`` that finds every run.

Kept current by the writer (``upsert_run`` from the heartbeat and ``finish``) and by
``flightlog index DIR`` scans. Hyper-parameters and metrics live in key/value tables
with a numeric and a text column, so ``--where "lora_rank>=32 and eval_acc>0.8"``
is an indexed SQL query over thousands of runs. The status column holds what
``run.json`` said; the effective status (``crashed`` for a silent heartbeat) is
computed at query time, so a run that died after it was indexed still shows as crashed.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

from flightlog.protocol import format_timestamp
from flightlog.runfile import effective_status
from flightlog.store.entry import as_number, entry_from_meta
from flightlog.store.where import Compare, Node, Not, WhereError, compares, parse

INDEX_FILE = "index.sqlite"
SCHEMA_VERSION = 1

# name -> (SQL expression, numeric?)
RUN_FIELDS: dict[str, tuple[str, bool]] = {
    "run_id": ("runs.run_id", False),
    "name": ("runs.name", False),
    "model": ("runs.model", False),
    "task": ("runs.task", False),
    "dataset": ("runs.dataset", False),
    "status": ("fl_status(runs.status, runs.heartbeat, runs.heartbeat_interval)", False),
    "start": ("runs.start_time", False),
    "end": ("runs.end_time", False),
    "duration": ("runs.duration_s", True),
    "steps": ("runs.last_step", True),
    "source": ("runs.source", False),
    "output_dir": ("runs.output_dir", False),
    "log_dir": ("runs.log_dir", False),
    "archive": ("runs.archive", False),
}
ALIASES = {
    "id": "run_id",
    "run_name": "name",
    "model_name": "model",
    "task_type": "task",
    "start_time": "start",
    "end_time": "end",
    "duration_s": "duration",
    "last_step": "steps",
}
PREFIXES = {"param": "param", "params": "param", "config": "param", "best": "best", "final": "final", "last": "final"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs(
    run_id TEXT PRIMARY KEY, name TEXT, model TEXT, task TEXT, dataset TEXT,
    status TEXT, heartbeat TEXT, heartbeat_interval REAL,
    start_time TEXT, end_time TEXT, start_ts REAL, end_ts REAL, duration_s REAL, last_step INTEGER,
    output_dir TEXT, log_dir TEXT, stream TEXT, checkpoints TEXT, source TEXT,
    archive TEXT, archived_at TEXT, indexed_at TEXT, meta TEXT
);
CREATE INDEX IF NOT EXISTS runs_start ON runs(start_time);
CREATE INDEX IF NOT EXISTS runs_name ON runs(name);
CREATE TABLE IF NOT EXISTS params(
    run_id TEXT NOT NULL, key TEXT NOT NULL, num REAL, text TEXT, PRIMARY KEY(run_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS params_key ON params(key, num);
CREATE TABLE IF NOT EXISTS metrics(
    run_id TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, num REAL, text TEXT, step INTEGER,
    PRIMARY KEY(run_id, kind, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS metrics_key ON metrics(kind, key, num);
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT);
"""

_RUN_COLUMNS = (
    "run_id", "name", "model", "task", "dataset", "status", "heartbeat", "heartbeat_interval",
    "start_time", "end_time", "start_ts", "end_ts", "duration_s", "last_step",
    "output_dir", "log_dir", "stream", "checkpoints", "source", "indexed_at", "meta",
)  # fmt: skip


class IndexUnavailable(RuntimeError):
    """The index file cannot be opened or is not a flightlog index."""


class RunNotFound(LookupError):
    """No run (or more than one) matches what the user named."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "run not found"


def home() -> Path:
    """``FLIGHTLOG_HOME``, else ``~/.flightlog``."""
    value = os.environ.get("FLIGHTLOG_HOME")
    return Path(value).expanduser() if value else Path.home() / ".flightlog"


def default_path() -> Path:
    return home() / INDEX_FILE


def _status(status: Any, heartbeat: Any, interval: Any) -> Any:
    if status != "running":
        return status
    return effective_status({"status": status, "heartbeat": heartbeat, "heartbeat_interval": interval or 10.0})


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _value(num: Any, text: Any) -> Any:
    """A stored (num, text) pair back to one Python value (the pair ``_text``/``as_number`` made)."""
    if text == "true" or text == "false":
        return text == "true"
    if text is not None and text[:1] in ("[", "{"):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
    if num is None:
        return text
    try:
        return int(text)  # ints stay ints ("32"), floats come back as floats
    except (TypeError, ValueError):
        return num


class RunIndex:
    """A connection to the index. Cheap to open; use as a context manager."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True, timeout: float = 10.0) -> None:
        """``timeout``: seconds to wait for another writer's lock (the training-side hook waits briefly)."""
        self.path = Path(path) if path is not None else default_path()
        if not create and not self.path.exists():
            raise IndexUnavailable(f"no run index at {self.path} (run 'flightlog index DIR' first, or set FLIGHTLOG_HOME)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self.db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO info VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except (sqlite3.DatabaseError, OSError) as exc:
            raise IndexUnavailable(f"cannot open the run index {self.path}: {exc}") from exc
        self.db.create_function("fl_status", 3, _status, deterministic=False)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "RunIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def upsert(self, entry: Mapping[str, Any]) -> None:
        """Insert or replace a run (its params and metrics too); keeps archive fields."""
        self.upsert_many([entry])

    def upsert_many(self, entries: Iterable[Mapping[str, Any]]) -> int:
        count = 0
        now = format_timestamp(time.time())
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            for entry in entries:
                row = dict(entry)
                run_id = row["run_id"]
                row["checkpoints"] = orjson.dumps(row.get("checkpoints") or []).decode()
                row["meta"] = orjson.dumps(row.get("meta") or {}, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
                row["indexed_at"] = now
                values = [row.get(c) for c in _RUN_COLUMNS]
                sets = ", ".join(f"{c}=excluded.{c}" for c in _RUN_COLUMNS[1:])
                cur.execute(
                    f"INSERT INTO runs({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_COLUMNS))}) "
                    f"ON CONFLICT(run_id) DO UPDATE SET {sets}",
                    values,
                )
                cur.execute("DELETE FROM params WHERE run_id=?", (run_id,))
                cur.execute("DELETE FROM metrics WHERE run_id=?", (run_id,))
                cur.executemany(
                    "INSERT INTO params VALUES (?,?,?,?)",
                    [(run_id, str(k), as_number(v), _text(v)) for k, v in (entry.get("params") or {}).items()],
                )
                metric_rows = [(run_id, "best", str(k), as_number(v), _text(v), s) for k, (v, s) in (entry.get("best") or {}).items()]
                metric_rows += [(run_id, "final", str(k), as_number(v), _text(v), None) for k, v in (entry.get("final") or {}).items()]
                cur.executemany("INSERT INTO metrics VALUES (?,?,?,?,?,?)", metric_rows)
                count += 1
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return count

    def set_archive(self, run_id: str, url: str | None) -> None:
        self.db.execute(
            "UPDATE runs SET archive=?, archived_at=? WHERE run_id=?",
            (url, format_timestamp(time.time()) if url else None, run_id),
        )

    def remove(self, run_id: str) -> None:
        with self.db:
            for table in ("runs", "params", "metrics"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))

    # ------------------------------------------------------------------ reading
    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM runs").fetchone()[0])

    def resolve(self, ref: str) -> str:
        """The run id for an id, an id prefix or a name (the latest run of that name)."""
        ref = str(ref)
        if not ref:
            raise RunNotFound("empty run name")
        row = self.db.execute("SELECT run_id FROM runs WHERE run_id=?", (ref,)).fetchone()
        if row:
            return str(row[0])
        escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        ids = [r[0] for r in self.db.execute("SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' LIMIT 6", (escaped + "%",))]
        if len(ids) == 1:
            return str(ids[0])
        if len(ids) > 1:
            raise RunNotFound(f"run id prefix {ref!r} is ambiguous: {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}")
        row = self.db.execute("SELECT run_id FROM runs WHERE name=? ORDER BY start_time DESC LIMIT 1", (ref,)).fetchone()
        if row:
            return str(row[0])
        raise RunNotFound(f"no run {ref!r} in the index {self.path} (an id, id prefix or run name; 'flightlog ls' lists them)")

    def get(self, ref: str) -> dict[str, Any]:
        """Everything about one run: columns, ``params``, ``best`` ({k: {value, step}}), ``final``."""
        run_id = self.resolve(ref)
        return self._full([run_id])[0]

    def _full(self, run_ids: list[str]) -> list[dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        cols = ", ".join(f"runs.{c}" for c in _RUN_COLUMNS if c != "status")
        for chunk in _chunks(run_ids, 500):
            marks = ",".join("?" * len(chunk))
            cur = self.db.execute(
                f"SELECT {cols}, runs.status, {RUN_FIELDS['status'][0]}, runs.archive, runs.archived_at "
                f"FROM runs WHERE run_id IN ({marks})",
                chunk,
            )
            names = [d[0] for d in cur.description]
            for values in cur:
                row = dict(zip(names[:-4], values[:-4]))
                row["recorded_status"], row["status"], row["archive"], row["archived_at"] = values[-4:]
                row["checkpoints"] = orjson.loads(row["checkpoints"] or "[]")
                row["meta"] = orjson.loads(row["meta"] or "{}")
                row["params"], row["best"], row["final"] = {}, {}, {}
                out[row["run_id"]] = row
            for run_id, key, num, text in self.db.execute(f"SELECT run_id, key, num, text FROM params WHERE run_id IN ({marks})", chunk):
                out[run_id]["params"][key] = _value(num, text)
            for run_id, kind, key, num, text, step in self.db.execute(
                f"SELECT run_id, kind, key, num, text, step FROM metrics WHERE run_id IN ({marks})", chunk
            ):
                if kind == "best":
                    out[run_id]["best"][key] = {"value": _value(num, text), "step": step}
                else:
                    out[run_id]["final"][key] = _value(num, text)
        return [out[r] for r in run_ids if r in out]

    # ------------------------------------------------------------------ query
    def field(self, name: str, text: str = "", pos: int = 0) -> tuple[str, str, str]:
        """Resolve a field name to ``(kind, key, label)``; kind is run, param, best or final.

        A bare name is a run field, else a hyper-parameter, else a best metric, else
        ``best_X``/``final_X`` for a metric X; ``param.X``, ``best.X``, ``final.X`` are explicit.
        """
        name = ALIASES.get(name, name)
        if name in RUN_FIELDS:
            return "run", name, name
        head, dot, rest = name.partition(".")
        if dot and head in PREFIXES and rest:
            kind = PREFIXES[head]
            return kind, rest, f"{kind}.{rest}" if kind != "param" else rest
        if self._has("params", name):
            return "param", name, name
        if self._has("metrics", name, "best"):
            return "best", name, f"best.{name}"
        for prefix, kind in (("best_", "best"), ("final_", "final"), ("last_", "final")):
            if name.startswith(prefix) and self._has("metrics", name[len(prefix):], kind):
                return kind, name[len(prefix):], f"{kind}.{name[len(prefix):]}"
        raise WhereError(
            f"unknown field {name!r}: not a run field ({', '.join(RUN_FIELDS)}), "
            "nor a hyper-parameter or metric of any indexed run",
            text or name,
            pos,
        )

    def _has(self, table: str, key: str, kind: str | None = None) -> bool:
        if table == "params":
            return self.db.execute("SELECT 1 FROM params WHERE key=? LIMIT 1", (key,)).fetchone() is not None
        return self.db.execute("SELECT 1 FROM metrics WHERE kind=? AND key=? LIMIT 1", (kind, key)).fetchone() is not None

    def _value_sql(self, kind: str, key: str, params: list[Any]) -> str:
        """A scalar SQL expression for a field's value in the current ``runs`` row."""
        if kind == "run":
            return RUN_FIELDS[key][0]
        if kind == "param":
            params.append(key)
            return "(SELECT COALESCE(p.num, p.text) FROM params p WHERE p.run_id=runs.run_id AND p.key=?)"
        params.extend((kind, key))
        return "(SELECT COALESCE(m.num, m.text) FROM metrics m WHERE m.run_id=runs.run_id AND m.kind=? AND m.key=?)"

    def _compile(self, node: Node, text: str, params: list[Any]) -> str:
        if isinstance(node, Compare):
            return self._compile_compare(node, text, params)
        if isinstance(node, Not):
            return f"NOT ({self._compile(node.item, text, params)})"
        joiner = f" {node.op.upper()} "
        return "(" + joiner.join(self._compile(item, text, params) for item in node.items) + ")"

    def _compile_compare(self, cmp: Compare, text: str, params: list[Any]) -> str:
        kind, key, _ = self.field(cmp.field, text, cmp.pos)
        op = cmp.op
        number = cmp.number
        if kind == "run":
            expr, numeric = RUN_FIELDS[key]
            if numeric:
                if op in ("~", "!~"):
                    raise WhereError(f"{cmp.field} is a number; '~' compares text", text, cmp.pos + len(cmp.field))
                value = _duration(cmp.value) if key == "duration" and number is None else number
                if value is None:
                    raise WhereError(f"{cmp.field} needs a number, got {cmp.value!r}", text, cmp.value_pos)
                params.append(value)
                return f"{expr} {op} ?"
            return _text_compare(expr, op, cmp.value, params)
        if kind == "param":
            table, cond = "params p", "p.run_id=runs.run_id AND p.key=?"
            params.append(key)
            alias = "p"
        else:
            table, cond = "metrics m", "m.run_id=runs.run_id AND m.kind=? AND m.key=?"
            params.extend((kind, key))
            alias = "m"
        if number is not None and op not in ("~", "!~"):
            params.append(number)
            test = f"{alias}.num {op} ?"
        else:
            test = _text_compare(f"{alias}.text", op, cmp.value, params)
        return f"EXISTS (SELECT 1 FROM {table} WHERE {cond} AND {test})"

    def query(
        self,
        where: str | None = None,
        sort: Iterable[str] | str | None = None,
        limit: int | None = None,
        columns: Iterable[str] = (),
        full: bool = False,
    ) -> list[dict[str, Any]]:
        """Runs matching ``where``, sorted (``-field`` for descending; default newest first).

        Each row has the run fields plus the fields named in ``where``, ``sort`` and
        ``columns``; with ``full=True`` also ``params``, ``best`` and ``final``.
        """
        params: list[Any] = []
        select_params: list[Any] = []
        tree = parse(where) if where and where.strip() else None
        sort_keys = [sort] if isinstance(sort, str) else list(sort or [])
        sort_keys = [s.strip() for part in sort_keys for s in part.split(",") if s.strip()]
        extra: dict[str, str] = {}
        param_labels: list[str] = []
        wanted = [(c.field, where or "", c.pos) for c in (compares(tree) if tree else [])]
        sorts = [sort_key(s) for s in sort_keys]
        wanted += [(name, s, 1 if s[0] in "-+" else 0) for s, (name, _) in zip(sort_keys, sorts)]
        wanted += [(c, c, 0) for c in columns]
        for name, text, pos in wanted:
            kind, key, label = self.field(name, text, pos)
            if kind == "run" or label in extra:
                continue
            extra[label] = self._value_sql(kind, key, select_params)
            if kind == "param":
                param_labels.append(label)
        sql_where = self._compile(tree, where or "", params) if tree else "1"
        aliases = {label: f"x{i}" for i, label in enumerate(extra)}
        order: list[str] = []
        for s, (name, desc) in zip(sort_keys, sorts):
            kind, key, label = self.field(name, s, 1 if s[0] in "-+" else 0)
            alias = key if kind == "run" else aliases[label]
            order.append(f'"{alias}" IS NULL, "{alias}" {"DESC" if desc else "ASC"}')
        order.append('"start" DESC, "run_id"')
        base = [c for c in RUN_FIELDS if c != "status"]
        select = [f'{RUN_FIELDS[c][0]} AS "{c}"' for c in base] + [f"{RUN_FIELDS['status'][0]} AS status"]
        select += [f'{expr} AS "{aliases[label]}"' for label, expr in extra.items()]
        sql = f"SELECT {', '.join(select)} FROM runs WHERE {sql_where} ORDER BY {', '.join(order)}"
        all_params = select_params + params
        if limit is not None:
            if int(limit) < 0:
                raise ValueError(f"limit must be >= 0, got {limit}")
            sql += " LIMIT ?"
            all_params.append(int(limit))
        cur = self.db.execute(sql, all_params)
        names = base + ["status"] + list(extra)
        rows = [dict(zip(names, values)) for values in cur]
        for label in param_labels:
            for row in rows:
                value = row.get(label)
                if type(value) is float and value.is_integer() and abs(value) < 2**53:
                    row[label] = int(value)
        if full and rows:
            details = {r["run_id"]: r for r in self._full([r["run_id"] for r in rows])}
            for row in rows:
                d = details.get(row["run_id"], {})
                row["params"], row["best"], row["final"] = d.get("params", {}), d.get("best", {}), d.get("final", {})
        return rows


def sort_key(text: str) -> tuple[str, bool]:
    """``-field``, ``field:desc`` -> (field, descending); ``+field``, ``field:asc``, ``field`` ascend."""
    text = text.strip()
    desc = text.startswith("-")
    name = text.lstrip("-+")
    head, colon, tail = name.rpartition(":")
    if colon and tail.lower() in ("asc", "desc"):
        name, desc = head, tail.lower() == "desc"
    return name, desc


def _text_compare(expr: str, op: str, value: str, params: list[Any]) -> str:
    if op in ("~", "!~"):
        if any(ch in value for ch in "*?["):
            params.append(value)
            test = f"{expr} GLOB ?"
        else:
            params.append(value.lower())
            test = f"instr(lower({expr}), ?) > 0"
        return f"NOT COALESCE({test}, 0)" if op == "!~" else test
    params.append(value)
    return f"{expr} {op} ?"


def _duration(text: str) -> float | None:
    m = _DURATION.match(text.strip().lower())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def upsert_run(meta: Mapping[str, Any], summary: Mapping[str, Any] | None = None, path: str | os.PathLike[str] | None = None) -> None:
    """The writer's hook: record a run from its ``run.json`` dict and live summary.

    Waits at most a quarter second for a lock held elsewhere (a big ``flightlog index``
    scan): the writer thread must get back to its records; the next heartbeat retries.
    """
    entry = entry_from_meta(meta, summary)
    with RunIndex(path, timeout=0.25) as index:
        index.upsert(entry)
