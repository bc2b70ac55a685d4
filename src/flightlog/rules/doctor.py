"""``flightlog doctor``: replay the rules over a finished or crashed run and explain it.

:func:`diagnose` takes any iterable of protocol records, so flightlog's own
``train.jsonl`` and the run-store importers (ms-swift ``logging.jsonl``, HF
``trainer_state.json``) feed it alike. The report has a timeline of findings (the
rules replayed offline, alerts recorded live, errors, stalls seen in the timestamps),
the likely causes and actions per rule from the seeds' tables, how the run ended, and
the best and last metrics.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from flightlog.pipeline.summary import SummaryTracker
from flightlog.protocol import ALERT, CHECKPOINT, EVENT, METRICS, RUN_END, RUN_START, make_finite, parse_timestamp
from flightlog.rules.advice import advice_for
from flightlog.rules.config import RulesConfig
from flightlog.rules.detectors import SEVERITIES
from flightlog.rules.engine import RulesEngine
from flightlog.rules.stall import StallWatch
from flightlog.runfile import effective_status, read_run_file


@dataclass
class Report:
    run: dict[str, Any]
    ended: str
    """finished / failed / interrupted / crashed / running / unknown."""
    ended_detail: str
    timeline: list[dict[str, Any]] = field(default_factory=list)
    causes: list[dict[str, Any]] = field(default_factory=list)
    warmup_notes: int = 0
    best: dict[str, Any] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    last_step: Any = None
    metrics_records: int = 0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return make_finite(asdict(self))  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- reading
def load_path(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
    """Records, run.json metadata and skipped-line count for a run directory, output directory or file.

    flightlog's own streams are read here; ms-swift ``logging.jsonl`` and HF
    ``trainer_state.json`` go through the run store's importers.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"flightlog doctor: {str(p)!r} does not exist")
    from flightlog.store.reader import ScanReport, read_records, resolve_run_dir

    own_stream = p.name.endswith((".jsonl", ".jsonl.gz")) and p.name != "logging.jsonl"
    if p.is_dir():
        try:
            log_dir = resolve_run_dir(p)
        except FileNotFoundError:
            log_dir = None
        if log_dir is not None:
            own_stream, p = True, log_dir
    if own_stream:
        report = ScanReport()
        with warnings.catch_warnings():  # counted in the report instead
            warnings.simplefilter("ignore")
            records = list(read_records(p, report=report))
        return records, read_run_file(p if p.is_dir() else p.parent), report.torn_lines + report.corrupt_lines
    return _imported(p), None, 0


def _imported(p: Path) -> list[dict[str, Any]]:
    try:
        from flightlog.store.importers import detect_formats  # type: ignore[attr-defined]
    except ImportError:
        raise ValueError(f"flightlog doctor: {str(p)!r} is not a flightlog run (no train.jsonl); reading ms-swift "
                         "logging.jsonl or HF trainer_state.json needs the run store's importers") from None
    target = p if p.is_dir() else p.parent
    for found in detect_formats(target):  # best source first
        source = Path(found.path)
        if p.is_dir() or source == p or (found.format == "hf" and source == p.parent):
            return list(found.open().records())
    raise ValueError(f"flightlog doctor: found no flightlog, ms-swift or HF trainer log in {str(p)!r}")


# --------------------------------------------------------------------------- diagnosis
def _time(record: dict[str, Any]) -> float | None:
    try:
        return parse_timestamp(record["timestamp"])
    except (KeyError, TypeError, ValueError):
        return None


def diagnose(records: Iterable[dict[str, Any]], meta: dict[str, Any] | None = None,
             config: RulesConfig | None = None, skipped_lines: int = 0) -> Report:
    """Replay the rules over ``records`` (any iterable of protocol records) and build the report."""
    config = config or RulesConfig()
    engine = RulesEngine(config)
    watch = StallWatch(config.stall)
    summary = SummaryTracker()
    timeline: list[dict[str, Any]] = []
    recorded: set[tuple[str, Any]] = set()
    run: dict[str, Any] = {k: meta.get(k) for k in ("run_id", "run_name", "task_type", "model_name", "dataset")} if meta else {}
    end: dict[str, Any] | None = None
    checkpoints: list[dict[str, Any]] = []
    warmup_notes = 0
    last_time: float | None = None

    def add(entry: dict[str, Any]) -> None:
        timeline.append({k: v for k, v in entry.items() if v is not None})

    for r in records:
        kind = r.get("type")
        t = _time(r)
        if kind == RUN_START:
            for key in ("run_id", "run_name", "task_type", "model_name", "dataset"):
                if r.get(key) and not run.get(key):
                    run[key] = r[key]
            run.setdefault("start_time", r.get("timestamp"))
            if r.get("resumed_from_step") is not None:
                add({"timestamp": r.get("timestamp"), "step": r["resumed_from_step"], "rule": "resume", "severity": "info",
                     "message": f"resumed from step {r['resumed_from_step']} (segment {r.get('segment')})", "source": "log"})
        elif kind == METRICS:
            summary.observe(r)
            if t is not None:
                stalled = watch.check(t)
                if stalled is not None:
                    add({"timestamp": r.get("timestamp"), **_entry(stalled), "source": "replay"})
                watch.observe(r.get("step") if type(r.get("step")) is int else None, t)
                last_time = t
            for f in engine.evaluate(r):
                if f.severity == "info":
                    warmup_notes += 1
                    continue
                add({"timestamp": r.get("timestamp"), **_entry(f), "source": "replay"})
        elif kind == ALERT:
            recorded.add((r.get("rule"), r.get("step")))
            add({"timestamp": r.get("timestamp"), "step": r.get("step"), "rule": r.get("rule"), "severity": r.get("severity", "warning"),
                 "message": r.get("message"), "value": r.get("value"), "threshold": r.get("threshold"),
                 "action": r.get("action"), "source": "recorded"})
        elif kind == EVENT and r.get("level") in ("ERROR", "CRITICAL"):
            add({"timestamp": r.get("timestamp"), "step": r.get("step"), "rule": "error", "severity": "critical" if r["level"] == "CRITICAL" else "warning",
                 "message": f"[{r.get('source', '?')}] {r.get('message', '')}", "source": "log"})
        elif kind == CHECKPOINT:
            checkpoints.append({k: r.get(k) for k in ("timestamp", "step", "status", "path")})
        elif kind == RUN_END:
            end = r
    # A live alert and its replay are the same finding: keep the recorded one.
    timeline = [e for e in timeline if not (e["source"] == "replay" and (e.get("rule"), e.get("step")) in recorded)]
    timeline.sort(key=lambda e: (e.get("timestamp") or "", e.get("step") or 0))
    ended, detail = _how_it_ended(end, meta, summary.last_step, last_time)
    return Report(run=run, ended=ended, ended_detail=detail, timeline=timeline, causes=_causes(timeline),
                  warmup_notes=warmup_notes, best={k: {"value": v, "step": summary.best_step.get(k)} for k, v in summary.best.items()},
                  last=summary.summary()["last"], last_step=summary.last_step, metrics_records=summary.metrics_records,
                  checkpoints=checkpoints, skipped_lines=skipped_lines)


def _entry(f: Any) -> dict[str, Any]:
    return {"step": f.step, "rule": f.rule, "severity": f.severity, "message": f.message, "value": f.value,
            "threshold": f.threshold, "action": f.action}


def _causes(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_rule: dict[str, dict[str, Any]] = {}
    for e in timeline:
        rule = e.get("rule")
        if e.get("severity") == "info" or rule in ("error", "resume", None):
            continue
        entry = by_rule.setdefault(rule, {"rule": rule, "severity": e["severity"], "count": 0, "first_step": e.get("step")})
        entry["count"] += 1
        if SEVERITIES.index(e["severity"]) > SEVERITIES.index(entry["severity"]):
            entry["severity"] = e["severity"]
    out = []
    for entry in by_rule.values():
        advice = advice_for(entry["rule"])
        out.append({**entry, "pattern": advice.pattern, "causes": list(advice.causes), "action": advice.action})
    out.sort(key=lambda c: (-SEVERITIES.index(c["severity"]), c.get("first_step") or 0))
    return out


def _how_it_ended(end: dict[str, Any] | None, meta: dict[str, Any] | None, last_step: Any, last_time: float | None) -> tuple[str, str]:
    if end is not None:
        return str(end.get("status", "unknown")), f"run_end record at step {end.get('step', last_step)} ({end.get('timestamp')})"
    if meta is not None:
        status = effective_status(meta)
        if status == "running" and _process_gone(meta):
            status = "crashed"
        if status == "crashed":
            return "crashed", (f"no run_end record; run.json still says running (last heartbeat {meta.get('heartbeat')}) "
                               f"but process {meta.get('pid')} is gone: it died (kill -9, OOM killer, node failure) after step {last_step}")
        if status == "running":
            return "running", f"still running (heartbeat {meta.get('heartbeat')}), last step {last_step}"
        return status, f"run.json says {status}"
    return "unknown", f"no run_end record: the process ended without finishing (killed or crashed?) after step {last_step}"


def _process_gone(meta: dict[str, Any]) -> bool:
    """True when run.json names a process on this host that no longer exists."""
    import socket

    pid, host = meta.get("pid"), (meta.get("hardware") or {}).get("host")
    if type(pid) is not int or host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


# --------------------------------------------------------------------------- rendering
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_text(report: Report, markdown: bool = False) -> str:
    h1, h2, bullet = ("# ", "## ", "- ") if markdown else ("", "", "  ")
    sub = "  - " if markdown else "    "
    run = report.run
    ident = f" ({run['run_id']})" if run.get("run_id") else ""
    lines = [f"{h1}flightlog doctor: run {run.get('run_name', '?')}{ident}", ""]
    lines.append(f"{h2}How it ended" if markdown else "How it ended:")
    lines.append(f"{bullet}{report.ended.upper()}: {report.ended_detail}")
    lines.append(f"{bullet}{report.metrics_records} metrics records, last step {report.last_step}; "
                 f"{len(report.checkpoints)} checkpoint record(s)" + (f"; {report.skipped_lines} unreadable line(s) skipped" if report.skipped_lines else ""))
    saved = [c for c in report.checkpoints if c.get("status") == "saved"]
    if saved:
        lines.append(f"{bullet}last checkpoint saved: step {saved[-1].get('step')} at {saved[-1].get('path')}")
    lines.append("")
    lines.append(f"{h2}Likely causes and actions" if markdown else "Likely causes and actions:")
    if not report.causes:
        lines.append(f"{bullet}no rule fired" + (f" ({report.warmup_notes} warmup note(s): swings while the lr warmed up, expected)" if report.warmup_notes else ""))
    for c in report.causes:
        lines.append(f"{bullet}{c['severity'].upper()} {c['rule']} x{c['count']} (first at step {c.get('first_step')}): {c['pattern']}")
        if c["causes"]:
            lines.append(f"{sub}causes: {'; '.join(c['causes'])}")
        if c["action"]:
            lines.append(f"{sub}action: {c['action']}")
    if report.causes and report.warmup_notes:
        lines.append(f"{bullet}({report.warmup_notes} warmup note(s) not counted: swings while the lr warmed up are expected)")
    lines.append("")
    lines.append(f"{h2}Timeline" if markdown else "Timeline:")
    if not report.timeline:
        lines.append(f"{bullet}(nothing to report)")
    for e in report.timeline:
        detail = ", ".join(f"{k}={_fmt(e[k])}" for k in ("value", "threshold") if k in e)
        lines.append(f"{bullet}{e.get('timestamp', '')} step {e.get('step', '-')} {e['severity'].upper()} {e['rule']}: {e.get('message', '')}"
                     + (f" ({detail})" if detail else "") + (" [live alert]" if e.get("source") == "recorded" else ""))
    lines.append("")
    lines.append(f"{h2}Metrics (best / last)" if markdown else "Metrics (best / last):")
    if markdown and report.last:
        lines += ["| metric | best | at step | last |", "|---|---|---|---|"]
    for key, last in report.last.items():
        if isinstance(last, (dict, list)) or key in ("stage", "precision"):
            continue
        best = report.best.get(key, {})
        if markdown:
            lines.append(f"| {key} | {_fmt(best.get('value', ''))} | {best.get('step', '')} | {_fmt(last)} |")
        else:
            b = f"best {_fmt(best['value'])} at step {best.get('step')}, " if best else ""
            lines.append(f"{bullet}{key}: {b}last {_fmt(last)}")
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str)
