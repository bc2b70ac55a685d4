"""The rules engine: a writer-thread processor that runs the detectors on each metrics record.

It owns what the detectors leave out: whether the run is warming up, and rate
limiting (one problem is one alert; the rule re-arms after ``rearm_after`` records
without its condition). Alerts go out as ``alert`` records through the writer's
``emit`` (so every sink, the console included, shows them) and to ``on_alert``
(notifiers, the stop policy). Notes that say "expected during warmup" go out as
``event`` records at INFO level: they inform, they do not alarm.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

from flightlog.protocol import ALERT, EVENT, METRICS, parse_timestamp
from flightlog.rules.config import RulesConfig
from flightlog.rules.detectors import DETECTORS, Detector, Finding, ValueDetector, number
from flightlog.rules.stall import StallWatch

Record = dict[str, Any]
_fromisoformat = datetime.fromisoformat


class WarmupTracker:
    """Is the run warming up? ``stage == "warmup"`` if the records say; else the first
    ``warmup_steps`` steps, or a learning rate that has risen since the first record."""

    def __init__(self, warmup_steps: int = 0, from_lr: bool = True) -> None:
        self.warmup_steps = warmup_steps
        self.from_lr = from_lr
        self._has_stage = False
        self._lr: float | None = None
        self._lr_rising = from_lr
        self.active = False

    def update(self, record: Mapping[str, Any]) -> bool:
        stage = record.get("stage")
        if isinstance(stage, str):
            self._has_stage = True
            self.active = stage == "warmup" or stage.lower() == "warmup"
            return self.active
        step = record.get("step")
        by_step = type(step) is int and step <= self.warmup_steps
        by_lr = False
        lr = number(record, "learning_rate")
        if not self._has_stage and self._lr_rising and lr is not None:
            # The first record cannot tell yet; it counts as warmup (notes, not alarms).
            by_lr = lr > self._lr if self._lr is not None else True
            self._lr_rising = by_lr
            self._lr = lr
        self.active = by_step or by_lr
        return self.active


class RateLimiter:
    """One alert per problem: a key that fired stays quiet while its condition lasts."""

    def __init__(self, rearm_after: int) -> None:
        self.rearm_after = rearm_after
        self._last_seen: dict[str, int] = {}
        self.suppressed = 0

    def admit(self, findings: Iterable[Finding], tick: int) -> list[Finding]:
        if not findings and not self._last_seen:
            return []  # the common case: nothing found, nothing armed
        out = []
        for f in findings:
            key = f.key or f.rule
            if key not in self._last_seen:
                out.append(f)
            else:
                self.suppressed += 1
            self._last_seen[key] = tick
        for key, seen in list(self._last_seen.items()):
            if tick - seen >= self.rearm_after:
                del self._last_seen[key]
        return out


def finding_to_record(finding: Finding, source: Mapping[str, Any] | None = None) -> Record:
    """The protocol record for a finding: an ``alert``, or an INFO ``event`` for notes."""
    record: Record
    if finding.severity == "info":
        record = {"type": EVENT, "level": "INFO", "source": "flightlog/rules", "rule": finding.rule,
                  "message": f"{finding.rule}: {finding.message}"}
    else:
        record = {"type": ALERT, **finding.alert_fields()}
    if finding.step is not None:
        record["step"] = finding.step
    if source is not None and "epoch" in source:
        record["epoch"] = source["epoch"]
    return record


def _compile(plan: list[tuple[str | None, Any]]) -> Callable[[Mapping[str, Any], bool, list[Finding]], None]:
    """``run(record, warmup, found)`` for a plan: the loop below, unrolled.

        for field, run in plan:
            if field is None: found += run(record, warmup)
            else: x = the finite number at record[field], or skip; for feed in run: found += feed(x, record, warmup)
    """
    names: dict[str, Any] = {"number": number, "isfinite": math.isfinite}
    lines = ["def run(record, warmup, found):"]
    for i, (field, target) in enumerate(plan):
        if field is None:
            names[f"u{i}"] = target
            lines += [f"    r = u{i}(record, warmup)", "    if r:", "        found.extend(r)"]
            continue
        lines += [f"    x = record.get({field!r})",
                  "    if type(x) is not float or x - x != 0.0:",
                  f"        x = number(record, {field!r})",
                  "        if x is not None and not isfinite(x):",
                  "            x = None",
                  "    if x is not None:"]
        for j, feed in enumerate(target):
            names[f"f{i}_{j}"] = feed
            lines += [f"        r = f{i}_{j}(x, record, warmup)", "        if r:", "            found.extend(r)"]
    lines.append("    return None")
    exec("\n".join(lines), names)  # noqa: S102 - our own source: names and repr() of field names only
    return names["run"]  # type: ignore[no-any-return]


class RulesEngine:
    """Processor ``record -> record``; findings leave through ``emit`` and ``on_alert``."""

    skip_emitted = True  # its own alerts pass the chain again; they must not be re-judged
    __name__ = "rules"

    def __init__(
        self,
        config: RulesConfig | None = None,
        *,
        emit: Callable[[Record], None] | None = None,
        on_alert: Callable[[Record], None] | None = None,
        watch: StallWatch | None = None,
    ) -> None:
        self.config = config or RulesConfig()
        self.detectors: list[Detector] = [
            DETECTORS[name](cfg) for name, cfg in self.config.detectors.items() if cfg.enabled
        ]
        self.warmup = WarmupTracker(self.config.warmup_steps, self.config.detect_warmup_from_lr)
        self.limiter = RateLimiter(self.config.rearm_after)
        self.emit = emit
        self.on_alert = on_alert
        self.watch = watch
        self.ticks = 0
        self.alerts = 0
        self._plans: dict[tuple[str, ...], Callable[[Mapping[str, Any], bool, list[Finding]], None]] = {}

    def _plan(self, record: Mapping[str, Any]) -> Callable[[Mapping[str, Any], bool, list[Finding]], None]:
        """What to run for a record with these keys, decided once per key set (a run logs few
        distinct ones): only detectors that can see something in it, in their order, and
        for a row of detectors of the same single metric, the value read and checked once.
        The plan is compiled to one function with a call per detector: a loop over bound
        methods costs about as much again as the cheap detectors themselves."""
        keys = tuple(record)
        if len(self._plans) >= 256:
            self._plans.clear()  # a run with ever-changing keys: keep the cache bounded
        present = set(keys)
        plan: list[tuple[str | None, Any]] = []
        for d in self.detectors:
            inputs = d.inputs()
            if inputs is not None and present.isdisjoint(inputs):
                continue
            if isinstance(d, ValueDetector) and type(d).update is ValueDetector.update:
                field = d.config.field  # type: ignore[attr-defined]
                if plan and plan[-1][0] == field:
                    plan[-1][1].append(d.feed)
                else:
                    plan.append((field, [d.feed]))
            else:
                plan.append((None, d.update))
        run = _compile(plan)
        self._plans[keys] = run
        return run

    def evaluate(self, record: Mapping[str, Any]) -> list[Finding]:
        """Run every detector on one metrics record; returns the findings that pass rate limiting."""
        tracker = self.warmup
        was_warmup = tracker.active
        stage = record.get("stage")
        if stage == "stable" or stage == "warmup" or stage == "train":  # what WarmupTracker.update does for these
            tracker._has_stage = True
            warmup = tracker.active = stage == "warmup"
        else:
            warmup = tracker.update(record)
        if was_warmup and not warmup:
            for d in self.detectors:
                d.on_warmup_end()
        self.ticks += 1
        run = self._plans.get(tuple(record))
        if run is None:
            run = self._plan(record)
        found: list[Finding] = []
        run(record, warmup, found)
        if not found and not self.limiter._last_seen:
            return found  # nothing found, nothing armed: admit() would return [] too
        return self.limiter.admit(found, self.ticks)

    def __call__(self, record: Record) -> Record:
        kind = record.get("type")
        if kind == METRICS:
            if self.watch is not None:
                self._observe(record)
            found = self.evaluate(record)
            if found:
                for finding in found:
                    self.publish(finding_to_record(finding, record))
        elif kind == ALERT and self.on_alert is not None:
            self.on_alert(record)  # an alert made by user code: notify it too
        return record

    def _observe(self, record: Mapping[str, Any]) -> None:
        step = record.get("step")
        last = self.watch._last_step  # type: ignore[union-attr]
        if type(step) is int and last is not None and step <= last:
            return  # no progress: observe() would ignore it; skip parsing the timestamp
        text = record.get("timestamp")
        try:
            # Python >= 3.11 reads a trailing "Z" itself: parse_timestamp's replace() is not needed
            t = _fromisoformat(text).timestamp() if type(text) is str else None
        except ValueError:
            t = None
        if t is None:
            try:
                t = parse_timestamp(record["timestamp"])
            except (KeyError, TypeError, ValueError):
                return
        note = self.watch.observe(step if type(step) is int else None, t)  # type: ignore[union-attr]
        if note is not None:
            self.publish(finding_to_record(note, record))

    def publish(self, record: Record) -> None:
        if self.emit is not None:
            self.emit(record)
        if record["type"] == ALERT:
            self.alerts += 1
            if self.on_alert is not None:
                self.on_alert(record)
