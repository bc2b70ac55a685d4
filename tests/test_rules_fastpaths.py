"""The shortcuts that make the rules cheap per record decide exactly what the plain
definitions decide: checked against straightforward reference implementations on
random series built to sit near every threshold, and on the engine's dispatch, the
timestamp parsing and the lock-free stall watch."""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from statistics import median
from typing import Any

import pytest

from flightlog.protocol import parse_timestamp
from flightlog.rules.config import RulesConfig, StallConfig
from flightlog.rules.detectors import LossSpike, Oscillation, Plateau, Rising, _robust_std, zigzag_swings
from flightlog.rules.engine import RulesEngine
from flightlog.rules.stall import StallWatch


def series(seed: int, n: int = 1500) -> list[float]:
    """Flat stretches, tiny noise, swings, jumps and trends, so that every gate opens and closes."""
    rng = random.Random(seed)
    out, x = [], 2.0
    while len(out) < n:
        kind = rng.choice(["flat", "tiny", "noise", "swing", "jump", "trend"])
        for i in range(rng.randint(60, 150) if kind in ("flat", "tiny") else rng.randint(10, 120)):
            if kind == "flat":
                pass
            elif kind == "tiny":
                x += rng.gauss(0.0, 0.0002)
            elif kind == "noise":
                x += rng.gauss(0.0, 0.05)
            elif kind == "swing":
                x += (0.7 if i % 2 else -0.7) * rng.uniform(0.8, 1.5)
            elif kind == "jump":
                x += rng.choice([0.0, 0.0, 1.5, -1.5])
            else:
                x += 0.02 + rng.gauss(0.0, 0.01)
            out.append(x)
    return out[:n]


class RefPlateau:
    """The plateau rule as defined: spread of the last ``window`` values under ``min_delta``."""

    def __init__(self, window: int = 50, min_delta: float = 0.0005) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.min_delta = min_delta

    def fires(self, x: float, warmup: bool) -> bool:
        self.values.append(x)
        if warmup or len(self.values) < self.values.maxlen:
            return False
        return max(self.values) - min(self.values) < self.min_delta and abs(x) > 10 * self.min_delta


class RefOscillation:
    """The oscillation rule computed in full on every record (noise level every 10 records)."""

    def __init__(self, window: int = 20, history: int = 200) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.diffs: deque[float] = deque(maxlen=history + window)
        self.window, self.noise, self.count = window, 0.0, 0

    def fires(self, x: float) -> tuple[int, float] | None:
        if self.values:
            self.diffs.append(x - self.values[-1])
        self.values.append(x)
        self.count += 1
        if self.count % 10 == 0 and len(self.diffs) >= self.window + 20:
            self.noise = 4.0 * _robust_std(list(self.diffs)[: len(self.diffs) - self.window])
        amplitude = max(0.5, self.noise, 0.1 * abs(median(self.values)))
        if max(self.values) - min(self.values) < amplitude:
            return None
        swings, biggest = zigzag_swings(self.values, amplitude)
        return (swings, amplitude) if swings >= 3 else None


@pytest.mark.parametrize("seed", range(6))
def test_plateau_gate_matches_the_definition(seed: int) -> None:
    detector, ref = Plateau(), RefPlateau()
    fired = 0
    for i, x in enumerate(series(seed)):
        warmup = i < 100
        got = bool(detector.update({"loss": x}, warmup))
        assert got == ref.fires(x, warmup), f"record {i}"
        fired += got
    assert fired > 0  # the series does hold flat stretches


@pytest.mark.parametrize("seed", range(6))
def test_oscillation_bounds_and_late_noise_match_the_definition(seed: int) -> None:
    detector, ref = Oscillation(), RefOscillation()
    fired = 0
    for i, x in enumerate(series(seed)):
        got = detector.update({"loss": x})
        want = ref.fires(x)
        assert bool(got) == (want is not None), f"record {i}"
        if got:
            fired += 1
            assert got[0].threshold == want[1]  # the same amplitude, noise level included
    assert fired > 0


@pytest.mark.parametrize("seed", range(4))
def test_loss_spike_and_rising_precheck_lose_nothing(seed: int) -> None:
    """With the pre-checks the tests run less often; with them forced on every record, the findings are the same."""

    class Always(LossSpike):
        def update(self, record: dict[str, Any], warmup: bool = False) -> list[Any]:
            x = record["loss"]
            found = self._test(x, self.config)  # type: ignore[arg-type]
            super_found = LossSpike.update(self, record, warmup)
            assert (found is not None) == bool(super_found)
            return super_found

    spike, rising = Always(), Rising()
    for i, x in enumerate(series(seed)):
        spike.update({"loss": x})
        got = rising.update({"loss": x})
        if len(rising._values) == rising.config.window and rising._rises < rising.config.consecutive:  # type: ignore[attr-defined]
            slope, t = rising._trend()
            level = abs(rising._s / rising.config.window) or 1.0  # type: ignore[attr-defined]
            rise = slope * (rising.config.window - 1)  # type: ignore[attr-defined]
            assert bool(got) == (t > rising.config.t_stat and rise > rising.config.min_rise * level), f"record {i}"  # type: ignore[attr-defined]


def test_records_without_a_detector_field_change_nothing() -> None:
    """Dispatch by key set: eval and system records in between leave the findings as they were."""
    rng = random.Random(3)
    train = [{"type": "metrics", "step": i + 1, "loss": x, "grad_norm": rng.uniform(0.5, 1.5), "learning_rate": 1e-4}
             for i, x in enumerate(series(7, 800))]
    mixed: list[dict[str, Any]] = []
    for r in train:
        mixed.append(r)
        if r["step"] % 7 == 0:
            mixed.append({"type": "metrics", "step": r["step"], "eval_loss": 9.0, "eval_runtime": 3.0})
        if r["step"] % 11 == 0:
            mixed.append({"type": "metrics", "cpu_percent": 50.0, "note": "text"})

    def findings(records: list[dict[str, Any]]) -> list[tuple[str, int | None, str]]:
        engine = RulesEngine(RulesConfig())
        engine.limiter.admit = lambda found, tick: list(found)  # type: ignore[method-assign]  # the limiter counts records
        out = []
        for r in records:
            out += [(f.rule, f.step, f.message) for f in engine.evaluate(r)]
        return out

    plain = findings(train)
    assert plain and findings(mixed) == plain


def test_timestamps_in_other_forms_are_parsed_as_before() -> None:
    config = RulesConfig()
    watch = StallWatch(config.stall)
    engine = RulesEngine(config, watch=watch)
    for step, text in enumerate(["2025-06-15T12:00:00.000Z", "2025-06-15T12:00:01.500+00:00", "2025-06-15T12:00:03Z"], 1):
        engine({"type": "metrics", "step": step, "loss": 1.0, "timestamp": text})
        assert watch._last_time == parse_timestamp(text)
    engine({"type": "metrics", "step": 9, "loss": 1.0, "timestamp": "not a time"})  # ignored, as before
    assert watch._last_step == 3 and list(watch._intervals) == [1.5, 1.5]


def test_stall_watch_alerts_once_per_silence_and_notes_recovery() -> None:
    watch = StallWatch(StallConfig(min_seconds=10.0, factor=3.0, min_intervals=3))
    for step in range(1, 6):
        assert watch.observe(step, float(step)) is None
    assert watch.check(14.0) is None  # 9 s of silence < 10 s
    stall = watch.check(20.0)
    assert stall is not None and stall.rule == "stall" and stall.step == 5 and stall.severity == "critical"
    assert watch.check(60.0) is None  # one alert per silence
    assert watch.observe(5, 61.0) is None  # the same step again is no progress
    note = watch.observe(6, 70.0)
    assert note is not None and note.severity == "info" and note.key == "stall:recovered" and note.value == 65.0
    assert list(watch._intervals) == [1.0, 1.0, 1.0, 1.0]  # the stalled gap is not a normal interval
    assert watch.observe(7, 71.0) is None and watch.check(80.0) is None
    assert watch.check(90.0) is not None  # a new silence alerts again


def test_stall_watch_without_lock_under_a_checking_thread() -> None:
    """The timer thread checks while the writer thread observes: no error, no false stall."""
    watch = StallWatch(StallConfig(min_seconds=0.5, factor=10.0, min_intervals=3))
    stop = threading.Event()
    found: list[Any] = []
    errors: list[BaseException] = []

    def checker() -> None:
        try:
            while not stop.is_set():
                last = watch._last_time
                if last is not None:
                    finding = watch.check(last + 0.01)
                    if finding is not None:
                        found.append(finding)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=checker)
    thread.start()
    try:
        for step in range(1, 30001):
            watch.observe(step, step * 0.001)
    finally:
        stop.set()
        thread.join()
    assert not errors and not found
    assert len(watch._intervals) == watch.config.window and math.isclose(median(watch._intervals), 0.001)


def test_engine_plan_equals_each_detector_on_its_own() -> None:
    """The compiled plan (one read of each metric for its row of detectors) finds what every
    detector's own ``update`` finds, for ints, protocol NaN/Inf strings, text and missing values."""
    rng = random.Random(11)
    odd: list[Any] = [3, "NaN", "Infinity", "-Infinity", True, "text", None]
    records = []
    for step, x in enumerate(series(5, 1200), 1):
        r: dict[str, Any] = {"type": "metrics", "step": step, "loss": x, "grad_norm": rng.uniform(0.001, 12.0),
                             "step_time_s": rng.uniform(0.5, 3.0), "learning_rate": 1e-4 * (1 + (step // 50) % 2), "stage": "train"}
        if rng.random() < 0.05:
            r[rng.choice(["loss", "grad_norm", "step_time_s"])] = rng.choice(odd)
        if rng.random() < 0.03:
            del r["loss"]
        records.append(r)
    engine = RulesEngine(RulesConfig())
    engine.limiter.admit = lambda found, tick: list(found)  # type: ignore[method-assign]
    alone = RulesEngine(RulesConfig()).detectors
    total = 0
    for r in records:
        warmup = engine.warmup.active
        got = [(f.rule, f.message) for f in engine.evaluate(r)]
        assert not warmup and not engine.warmup.active  # no warmup here: the detectors alone need none
        want = [(f.rule, f.message) for d in alone for f in d.update(r, False)]
        assert got == want, f"step {r['step']}"
        total += len(got)
    assert total > 20  # the series does trip the rules
