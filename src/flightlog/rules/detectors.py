"""Streaming detectors: one small class per rule, fed one metrics record at a time.

Each detector is pure (no clock, no I/O): ``update(record, warmup) -> list[Finding]``
returns what it sees in this record, every time it sees it. Turning a condition that
lasts into one alert is the engine's job (:mod:`flightlog.rules.engine`), so the
detectors stay easy to test on a plain list of numbers.

``warmup`` is true while the scheduler warms up; detectors whose pattern is expected
then (oscillation, jumps, big gradients) report an ``info`` finding that says so
instead of a warning, and forget the warmup values when it ends so that the first
real spike after warmup is judged against post-warmup noise only.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import islice
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from flightlog.protocol import NONFINITE_STRINGS
from flightlog.rules.advice import advice_for

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Finding:
    """One observation of a rule's condition (an alert once the engine lets it through)."""

    rule: str
    severity: str
    message: str
    step: int | None = None
    value: float | None = None
    threshold: float | None = None
    action: str = ""
    key: str = ""
    """Identity of the problem for rate limiting (default: the rule name)."""

    def alert_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "severity": self.severity, "message": self.message}
        if self.value is not None:
            out["value"] = self.value
        if self.threshold is not None:
            out["threshold"] = self.threshold
        if self.action:
            out["action"] = self.action
        return out


def number(record: Mapping[str, Any], key: str) -> float | None:
    """The record's value for ``key`` as a float, or None if absent or not a number.

    The writer has already turned NaN/Inf into the protocol's strings when the rules
    see a record, so those strings count as the numbers they stand for.
    """
    value = record.get(key)
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    if type(value) is str and value in NONFINITE_STRINGS:
        return NONFINITE_STRINGS[value]
    return None


def median(values: Any) -> float:
    """``statistics.median`` without its generality (same result, a third of the cost)."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        raise ValueError("no median for empty data")
    if n % 2 == 1:
        return data[n // 2]
    i = n // 2
    return (data[i - 1] + data[i]) / 2


def _robust_std(values: Any) -> float:
    """Standard deviation estimated from the median absolute deviation (spikes do not inflate it)."""
    data = list(values)
    mid = median(data)
    return 1.4826 * median([abs(v - mid) for v in data])


@dataclass(kw_only=True)
class DetectorConfig:
    enabled: bool = True
    severity: str = "warning"


class Detector:
    """Base: a name, a severity, a config dataclass; subclasses implement ``update``."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[DetectorConfig]] = DetectorConfig

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()

    @property
    def severity(self) -> str:
        return self.config.severity

    def update(self, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        raise NotImplementedError

    def inputs(self) -> tuple[str, ...] | None:
        """Fields without which ``update`` does nothing (not even update its state); the
        engine skips the detector for records that have none of them. None: always run."""
        return None

    def on_warmup_end(self) -> None:
        """Forget what was learnt during warmup (its noise is not the run's noise)."""

    def _median(self, min_values: int) -> float | None:
        """Median of ``self._values``, recomputed every 8 calls (it moves slowly; sorting is not free)."""
        values: deque[float] = self._values  # type: ignore[attr-defined]
        if len(values) < min_values:
            return None
        calls = self._median_calls
        self._median_calls = calls + 1
        if calls % 8 == 0 or self._median_cache is None:
            self._median_cache = median(values)
        return self._median_cache

    _median_calls = 0
    _median_cache: float | None = None

    def finding(self, message: str, record: Mapping[str, Any], value: float | None = None,
                threshold: float | None = None, *, warmup: bool = False, key: str = "") -> Finding:
        step = record.get("step")
        if warmup:
            note = advice_for("warmup")
            return Finding(self.name, "info", f"{message} during warmup: {note.action}",
                           step if type(step) is int else None, value, threshold, "", f"warmup:{key or self.name}")
        return Finding(self.name, self.severity, message, step if type(step) is int else None, value,
                       threshold, advice_for(self.name).action, key or self.name)


class ValueDetector(Detector):
    """A detector of one metric's finite values (``config.field``): ``feed`` gets the value.

    The engine reads and checks the value once for all the detectors of that field in a
    row (the loss has four), instead of each detector doing it again.
    """

    def inputs(self) -> tuple[str, ...]:
        return (self.config.field,)  # type: ignore[attr-defined]

    def update(self, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        key = self.config.field  # type: ignore[attr-defined]
        x = record.get(key)
        if type(x) is not float or x - x != 0.0:
            x = number(record, key)
            if x is None or not math.isfinite(x):
                return []
        return self.feed(x, record, warmup)

    def feed(self, x: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        """``update`` for a record whose ``config.field`` is the finite number ``x``."""
        raise NotImplementedError


# --------------------------------------------------------------------------- NaN / Inf
@dataclass(kw_only=True)
class NonFiniteConfig(DetectorConfig):
    severity: str = "critical"
    fields: tuple[str, ...] = ("loss", "grad_norm")


class NonFinite(Detector):
    """NaN or Inf in the loss or gradient norm: the run is lost from here on."""

    name = "nonfinite"
    Config = NonFiniteConfig

    def inputs(self) -> tuple[str, ...]:
        return tuple(self.config.fields)  # type: ignore[attr-defined]

    def update(self, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        out = []
        for key in self.config.fields:  # type: ignore[attr-defined]
            value = record.get(key)
            if type(value) is float and value - value == 0.0:
                continue  # the common case: a finite float
            value = number(record, key)
            if value is not None and not math.isfinite(value):
                out.append(self.finding(f"{key} is {value}", record, value, key=f"nonfinite:{key}"))
        return out


# --------------------------------------------------------------------------- loss spike
@dataclass(kw_only=True)
class LossSpikeConfig(DetectorConfig):
    field: str = "loss"
    window: int = 128
    """OLMo-core: z-score over a rolling window of 128 values ..."""
    sigmas: float = 6.0
    """... flags values more than 6 standard deviations above the window mean ..."""
    min_values: int = 20
    """... once the window holds 20 values."""
    ratio_to_max: float = 10.0
    """Megatron: a value >= 10x the maximum of the first ``max_reference`` values."""
    max_reference: int = 100
    jump: float = 1.0
    """Seeds: a single-step jump > 1.0 ..."""
    jump_sigmas: float = 5.0
    """... that is also this many robust standard deviations of the step-to-step changes (noise-aware) ..."""
    jump_relative: float = 0.2
    """... and this fraction of the loss level (the seeds' 1.0 is for LM losses of 1-5; a loss of 1000 jumps by more)."""


class LossSpike(ValueDetector):
    """Loss spike by three tests (z-score, ratio to early maximum, single-step jump); any one fires."""

    name = "loss_spike"
    Config = LossSpikeConfig

    def __init__(self, config: LossSpikeConfig | None = None) -> None:
        super().__init__(config)
        self.on_warmup_end()

    def on_warmup_end(self) -> None:
        c: LossSpikeConfig = self.config  # type: ignore[assignment]
        self._values: deque[float] = deque(maxlen=c.window)
        self._diffs: deque[float] = deque(maxlen=c.window)
        self._reference: list[float] = []
        self._reference_max = -math.inf  # max(self._reference), kept as it grows
        self._last: float | None = None
        self._sum = self._sumsq = 0.0

    def feed(self, x: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: LossSpikeConfig = self.config  # type: ignore[assignment]
        values = self._values
        last = self._last
        # Each test needs x above something; only when one may pass are the tests run.
        # The z-score test is pre-checked without the square root, with a 2 % margin so
        # that rounding can never skip a value the exact test would flag.
        n = len(values)
        if n >= c.min_values and x > (mean := self._sum / n):
            d = x - mean
            z_may = d * d > 0.98 * c.sigmas * c.sigmas * (self._sumsq / n - mean * mean)
        else:
            z_may = False
        if z_may or x >= c.ratio_to_max * self._reference_max or (last is not None and x - last > c.jump):
            found = self._test(x, c)
        else:
            found = None
        if last is not None:
            self._diffs.append(x - last)
        self._last = x
        if len(values) == values.maxlen:
            old = values[0]
            self._sum -= old
            self._sumsq -= old * old
        values.append(x)
        self._sum += x
        self._sumsq += x * x
        if len(self._reference) < c.max_reference:
            self._reference.append(x)
            if x > self._reference_max:
                self._reference_max = x
        if found is None:
            return []
        message, threshold = found
        return [self.finding(message, record, x, threshold, warmup=warmup)]

    def _test(self, x: float, c: LossSpikeConfig) -> tuple[str, float] | None:
        values = self._values
        if len(values) >= c.min_values:
            n = len(values)
            mean = self._sum / n
            std = math.sqrt(max(self._sumsq / n - mean * mean, 0.0))
            if std > 0 and (x - mean) / std > c.sigmas:
                return f"{c.field} {x:.4g} is {(x - mean) / std:.1f} sigma above the mean of the last {n} values ({mean:.4g})", mean + c.sigmas * std
        if self._reference and len(self._reference) >= min(c.min_values, c.max_reference):
            top = self._reference_max
            if top > 0 and x >= c.ratio_to_max * top:
                return f"{c.field} {x:.4g} is {x / top:.1f}x the maximum of the first {len(self._reference)} values", c.ratio_to_max * top
        if self._last is not None:
            jump = x - self._last
            if jump > c.jump and jump > c.jump_relative * abs(self._last):
                limit = max(c.jump, c.jump_relative * abs(self._last))
                if len(self._diffs) >= 5:
                    limit = max(limit, c.jump_sigmas * _robust_std(self._diffs))
                if jump > limit:
                    return f"{c.field} jumped {self._last:.4g} -> {x:.4g} (+{jump:.3g}) in one step", limit
        return None


# --------------------------------------------------------------------------- plateau
@dataclass(kw_only=True)
class PlateauConfig(DetectorConfig):
    field: str = "loss"
    window: int = 50
    min_delta: float = 0.0005
    """Seeds: loss constant = changes less than 0.0005 over 50 steps."""


class Plateau(ValueDetector):
    """Loss flat to within ``min_delta`` for ``window`` records: nothing is being learnt."""

    name = "loss_plateau"
    Config = PlateauConfig

    def __init__(self, config: PlateauConfig | None = None) -> None:
        super().__init__(config)
        self._values: deque[float] = deque(maxlen=self.config.window)  # type: ignore[attr-defined]
        self._seen = 0
        self._moved_at = -1
        """Index of the last value that moved by ``min_delta`` or more from the one before:
        while it is in the window, the window's spread is at least that move (no max/min needed)."""

    def feed(self, x: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: PlateauConfig = self.config  # type: ignore[assignment]
        values = self._values
        if values and abs(x - values[-1]) >= c.min_delta:
            self._moved_at = self._seen
        self._seen += 1
        values.append(x)
        if warmup or len(values) < c.window:
            return []
        if self._moved_at > self._seen - len(values):
            return []  # a move of min_delta within the window: not flat
        spread = max(values) - min(values)
        # A loss near zero is a converged loss, not a stuck one.
        if spread < c.min_delta and abs(self._values[-1]) > 10 * c.min_delta:
            return [self.finding(f"{c.field} changed only {spread:.2g} over the last {c.window} records (stuck at {x:.4f})",
                                 record, spread, c.min_delta)]
        return []


# --------------------------------------------------------------------------- oscillation
@dataclass(kw_only=True)
class OscillationConfig(DetectorConfig):
    field: str = "loss"
    window: int = 20
    amplitude: float = 0.5
    """Seeds: peak-valley difference > 0.5."""
    min_swings: int = 3
    """Up/down moves larger than ``amplitude`` within the window (a single spike is 2)."""
    noise_sigmas: float = 4.0
    """Noise-aware: a move must also exceed this many robust standard deviations of the
    step-to-step changes seen before the window (a noisy run is not an oscillating one)."""
    history: int = 200
    relative_amplitude: float = 0.1
    """Moves must also be this fraction of the loss level (matters before the noise is known, for large losses)."""


def zigzag_swings(values: Any, amplitude: float) -> tuple[int, float]:
    """Number of alternating moves of at least ``amplitude``, and the window's peak-valley.

    A trend is one move, a spike two (up, down); oscillation is many. Noise smaller
    than ``amplitude`` never counts, so a steadily falling loss does not look like swings.
    """
    data = list(values)
    if not data:
        return 0, 0.0
    amplitude -= 1e-9 * max(1.0, amplitude)  # 1.8 - 1.3 is 0.4999999999999999 in floats
    hi = lo = extreme = data[0]
    direction = swings = 0
    for v in data[1:]:
        if direction == 0:
            hi, lo = max(hi, v), min(lo, v)
            if v - lo >= amplitude:
                direction, extreme, swings = 1, v, 1
            elif hi - v >= amplitude:
                direction, extreme, swings = -1, v, 1
        elif direction > 0:
            if v > extreme:
                extreme = v
            elif extreme - v >= amplitude:
                direction, extreme, swings = -1, v, swings + 1
        else:
            if v < extreme:
                extreme = v
            elif v - extreme >= amplitude:
                direction, extreme, swings = 1, v, swings + 1
    return swings, max(data) - min(data)


class Oscillation(ValueDetector):
    """Loss swinging by more than ``amplitude`` several times within a short window."""

    name = "loss_oscillation"
    Config = OscillationConfig

    def __init__(self, config: OscillationConfig | None = None) -> None:
        super().__init__(config)
        self.on_warmup_end()

    def on_warmup_end(self) -> None:
        c: OscillationConfig = self.config  # type: ignore[assignment]
        self._values: deque[float] = deque(maxlen=c.window)
        # The last history + window changes, plus 10 kept so that the noise level can be
        # estimated up to 9 records late from the changes it was due on (see _noise_due).
        self._diffs: deque[float] = deque(maxlen=c.history + c.window + 10)
        self._ndiffs = 0
        self._noise = 0.0
        self._noise_due: tuple[int, int] | None = None
        """(first, end) numbers of the changes the noise level is due to be estimated from
        (it is estimated when first needed, which most records never do)."""
        self._count = 0
        self._hi = -math.inf
        self._lo = math.inf
        """Bounds on the window's max and min (exact when set, then only widened): while they
        are closer than ``amplitude``, so are the max and min, and no swing can be that large."""

    def feed(self, x: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: OscillationConfig = self.config  # type: ignore[assignment]
        values, diffs = self._values, self._diffs
        if values:
            diffs.append(x - values[-1])
            self._ndiffs += 1
        values.append(x)
        self._count += 1
        if self._count % 10 == 0:
            kept = min(len(diffs), c.history + c.window)  # the changes a deque of that size would hold
            if kept >= c.window + 20:
                self._noise_due = (self._ndiffs - kept, self._ndiffs - c.window)
        # The amplitude is at least c.amplitude and the noise level: most records stop here,
        # before max/min, the noise estimate and the median (sorting) are needed.
        if x > self._hi:
            self._hi = x
        if x < self._lo:
            self._lo = x
        if self._hi - self._lo < c.amplitude:
            return []
        self._hi, self._lo = hi, lo = max(values), min(values)
        spread = hi - lo
        if spread < c.amplitude:
            return []
        if self._noise_due is not None:
            first, end = self._noise_due
            oldest = self._ndiffs - len(diffs)  # number of the oldest change still in the deque
            self._noise = c.noise_sigmas * _robust_std(islice(diffs, first - oldest, end - oldest))
            self._noise_due = None
        if spread < self._noise:
            return []
        level = abs(median(values))
        amplitude = max(c.amplitude, self._noise, c.relative_amplitude * level)
        if spread < amplitude:
            return []  # no move can be that large: skip the zigzag walk
        swings, biggest = zigzag_swings(values, amplitude)
        if swings >= c.min_swings:
            return [self.finding(f"{c.field} swings {swings} times by more than {amplitude:.3g} within {len(self._values)} records "
                                 f"(peak-valley {biggest:.3g})", record, biggest, amplitude, warmup=warmup)]
        return []


# --------------------------------------------------------------------------- rising loss
@dataclass(kw_only=True)
class RisingConfig(DetectorConfig):
    field: str = "loss"
    consecutive: int = 10
    """Seeds (Alertmanager example): 10 consecutive rises."""
    window: int = 50
    t_stat: float = 8.0
    """Noise-aware trend test: the slope's t-statistic over ``window`` records ..."""
    min_rise: float = 0.05
    """... and a fitted rise of at least this fraction of the loss level."""


def slope_t(values: Any) -> tuple[float, float]:
    """Least-squares slope of ``values`` against their index, and its t-statistic."""
    ys = list(values)
    n = len(ys)
    if n < 3:
        return 0.0, 0.0
    mx = (n - 1) / 2
    my = sum(ys) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    sxy = sum((i - mx) * (y - my) for i, y in enumerate(ys))
    slope = sxy / sxx
    resid = sum((y - my - slope * (i - mx)) ** 2 for i, y in enumerate(ys))
    se = math.sqrt(resid / (n - 2) / sxx) if resid > 0 else 0.0
    return slope, (slope / se if se > 0 else (math.inf if slope > 0 else 0.0))


class Rising(ValueDetector):
    """Loss going up: N consecutive rises, or a significant upward trend (divergence).

    The trend's regression runs on sums kept up to date as the window slides (O(1) per
    record; re-summed now and then against float drift).
    """

    name = "loss_rising"
    Config = RisingConfig

    def __init__(self, config: RisingConfig | None = None) -> None:
        super().__init__(config)
        self.on_warmup_end()

    def on_warmup_end(self) -> None:
        self._values: deque[float] = deque(maxlen=self.config.window)  # type: ignore[attr-defined]
        self._rises = 0
        self._s = self._q = self._p = 0.0  # sum y, sum y^2, sum i*y
        self._updates = 0

    def _trend(self) -> tuple[float, float]:
        n = len(self._values)
        sxx = n * (n * n - 1) / 12.0
        slope = (self._p - (n - 1) / 2.0 * self._s) / sxx
        resid = (self._q - self._s * self._s / n) - slope * slope * sxx
        if resid <= 1e-15 * max(1.0, self._q):
            return slope, math.inf if slope > 0 else 0.0
        return slope, slope / math.sqrt(resid / (n - 2) / sxx)

    def feed(self, x: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: RisingConfig = self.config  # type: ignore[assignment]
        values = self._values
        if values and x > values[-1]:
            self._rises += 1
        else:
            self._rises = 0
        # The window's sums, updated on locals (this runs for every record)
        n = len(values)
        s, q, p = self._s, self._q, self._p
        if n == values.maxlen:
            y0 = values[0]
            p -= s - y0
            s -= y0
            q -= y0 * y0
            n -= 1
        values.append(x)
        self._s = s = s + x
        self._q = q + x * x
        self._p = p + n * x
        self._updates += 1
        if self._updates % 256 == 0:
            self._s = sum(values)
            self._q = sum(v * v for v in values)
            self._p = sum(i * v for i, v in enumerate(values))
        if warmup:
            return []
        if self._rises >= c.consecutive:
            return [self.finding(f"{c.field} rose {self._rises} times in a row (now {x:.4g})", record, float(self._rises), float(c.consecutive))]
        # Both tests must pass: the rise (cheap, the slope alone) is looked at before the t-statistic.
        n = len(values)
        if n == c.window and self._p - (n - 1) / 2.0 * self._s > 0:
            slope = (self._p - (n - 1) / 2.0 * self._s) / (n * (n * n - 1) / 12.0)  # as in _trend()
            level = abs(self._s / c.window) or 1.0
            rise = slope * (c.window - 1)
            if rise > c.min_rise * level and (t := self._trend()[1]) > c.t_stat:
                return [self.finding(f"{c.field} trends upward: +{rise:.3g} over the last {c.window} records (t={t:.1f})",
                                     record, rise, c.min_rise * level)]
        return []


# --------------------------------------------------------------------------- gradients
@dataclass(kw_only=True)
class GradExplosionConfig(DetectorConfig):
    field: str = "grad_norm"
    threshold: float = 5.0
    """Seeds: grad_norm > 5.0 may be gradient explosion ..."""
    ratio: float = 3.0
    """... and (once ``min_values`` are known) more than this times the recent median."""
    window: int = 50
    min_values: int = 20


class GradExplosion(ValueDetector):
    name = "grad_explosion"
    Config = GradExplosionConfig
    _median_from: tuple[float, ...] | None = None

    def __init__(self, config: GradExplosionConfig | None = None) -> None:
        super().__init__(config)
        # Warmup values are kept: big warmup gradients only make the reference more tolerant.
        self._values: deque[float] = deque(maxlen=self.config.window)  # type: ignore[attr-defined]

    def feed(self, g: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: GradExplosionConfig = self.config  # type: ignore[assignment]
        if g <= c.threshold:
            # Cannot alert: keep the median's bookkeeping exact, but sort only when it is read.
            values = self._values
            if len(values) >= c.min_values:
                calls = self._median_calls
                self._median_calls = calls + 1
                if calls % 8 == 0 or (self._median_cache is None and self._median_from is None):
                    self._median_from = tuple(values)  # the median _median() would compute now
            values.append(g)
            return []
        if self._median_from is not None:
            self._median_cache = median(self._median_from)
            self._median_from = None
        usual = self._median(c.min_values)
        self._values.append(g)
        # Until the run's usual norm is known, only a clear explosion (threshold x ratio) counts:
        # some models simply run with norms above 5.
        if g > c.threshold and (g > c.ratio * usual if usual is not None else g > c.ratio * c.threshold):
            where = f", {g / usual:.1f}x the recent median {usual:.3g}" if usual else ""
            return [self.finding(f"{c.field} {g:.4g} > {c.threshold}{where}", record, g, c.threshold, warmup=warmup)]
        return []


@dataclass(kw_only=True)
class GradVanishingConfig(DetectorConfig):
    field: str = "grad_norm"
    threshold: float = 0.01
    """Seeds: grad_norm < 0.01 may be vanishing gradients ..."""
    patience: int = 10
    """... for this many records in a row (one tiny value is not a trend)."""


class GradVanishing(ValueDetector):
    name = "grad_vanishing"
    Config = GradVanishingConfig

    def __init__(self, config: GradVanishingConfig | None = None) -> None:
        super().__init__(config)
        self._count = 0

    def feed(self, g: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: GradVanishingConfig = self.config  # type: ignore[assignment]
        self._count = self._count + 1 if g < c.threshold else 0
        if self._count >= c.patience and not warmup:
            return [self.finding(f"{c.field} {g:.3g} < {c.threshold} for {self._count} records", record, g, c.threshold)]
        return []


@dataclass(kw_only=True)
class AdapterStalledConfig(DetectorConfig):
    adapter_field: str = "grad_norm_adapter"
    backbone_field: str = "grad_norm_backbone"
    threshold: float = 1e-4
    """Adapter gradient norm below this is "near zero" (seeds' QLoRA case: 1.2e-6)."""
    patience: int = 10


class AdapterStalled(Detector):
    """Adapter (LoRA) gradients near zero while the backbone is frozen: the adapter does not learn."""

    name = "adapter_stalled"
    Config = AdapterStalledConfig

    def __init__(self, config: AdapterStalledConfig | None = None) -> None:
        super().__init__(config)
        self._count = 0

    def inputs(self) -> tuple[str, ...]:
        return (self.config.adapter_field,)  # type: ignore[attr-defined]

    def update(self, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: AdapterStalledConfig = self.config  # type: ignore[assignment]
        a = record.get(c.adapter_field)
        if type(a) is not float:
            a = number(record, c.adapter_field)
            if a is None:
                return []
        b = record.get(c.backbone_field)
        if b is not None and type(b) is not float:
            b = number(record, c.backbone_field)
        frozen = b is None or b == 0.0
        self._count = self._count + 1 if frozen and a < c.threshold else 0
        if self._count >= c.patience and not warmup:
            return [self.finding(f"{c.adapter_field} {a:.2g} < {c.threshold} for {self._count} records with the backbone frozen",
                                 record, a, c.threshold)]
        return []


# --------------------------------------------------------------------------- system
@dataclass(kw_only=True)
class MemoryConfig(DetectorConfig):
    fraction: float = 0.95
    """Seeds: a card above 95% of its memory is at OOM risk."""


class MemoryPressure(Detector):
    name = "memory_pressure"
    Config = MemoryConfig

    def inputs(self) -> tuple[str, ...]:
        return ("gpu_memory_total_mb",)

    def update(self, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: MemoryConfig = self.config  # type: ignore[assignment]
        total = record.get("gpu_memory_total_mb")
        if type(total) is not float:
            total = number(record, "gpu_memory_total_mb")
        if not total or total <= 0:
            return []
        used = record.get("gpu_memory_mb")
        if type(used) is not float:
            used = number(record, "gpu_memory_mb")
        peak = record.get("gpu_memory_peak_mb")
        if peak is not None:
            peak = number(record, "gpu_memory_peak_mb")
        if peak is not None and (used is None or peak > used):
            used = peak
        if used is None:
            return []
        share = used / total
        if share > c.fraction:
            return [self.finding(f"GPU memory {used / 1024:.1f}GB/{total / 1024:.1f}GB ({share:.0%}) is above {c.fraction:.0%}: OOM risk",
                                 record, round(share, 4), c.fraction)]
        return []


@dataclass(kw_only=True)
class SlowStepConfig(DetectorConfig):
    field: str = "step_time_s"
    factor: float = 2.0
    """Seeds: step time suddenly doubled -> I/O bottleneck or memory fragmentation."""
    window: int = 50
    min_values: int = 10
    patience: int = 3
    """Slow records in a row (one slow step is a checkpoint or an eval, not a bottleneck)."""


class SlowStep(ValueDetector):
    name = "slow_step"
    Config = SlowStepConfig

    def __init__(self, config: SlowStepConfig | None = None) -> None:
        super().__init__(config)
        self._values: deque[float] = deque(maxlen=self.config.window)  # type: ignore[attr-defined]
        self._count = 0

    def feed(self, t: float, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        c: SlowStepConfig = self.config  # type: ignore[assignment]
        if t <= 0:
            return []
        values = self._values
        if len(values) < c.min_values:
            usual = None
        else:  # self._median(c.min_values), inlined
            calls = self._median_calls
            self._median_calls = calls + 1
            if calls % 8 == 0 or self._median_cache is None:
                self._median_cache = median(values)
            usual = self._median_cache
        slow = usual is not None and t > c.factor * usual
        self._count = self._count + 1 if slow else 0
        if not slow:
            self._values.append(t)  # slow steps do not become the new normal
        if self._count >= c.patience and usual is not None:
            data = number(record, "data_time_s")
            why = f"; data loading takes {data / t:.0%} of it" if data is not None and data > 0.5 * t else ""
            return [self.finding(f"step time {t:.3g}s is {t / usual:.1f}x the recent median {usual:.3g}s for {self._count} records{why}",
                                 record, t, c.factor * usual)]
        return []


# --------------------------------------------------------------------------- schedule
@dataclass(kw_only=True)
class CyclicLRConfig(DetectorConfig):
    window: int = 400
    min_cycles: int = 2
    """Learning-rate rises after a fall (a decay schedule has none after warmup)."""
    correlation: float = 0.4
    """Pearson correlation between the learning rate and the detrended loss."""
    every: int = 10


def _pearson(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


class CyclicLR(Detector):
    """Loss peaks that line up with learning-rate peaks: a cyclic schedule where a decay was meant."""

    name = "cyclic_lr"
    Config = CyclicLRConfig

    def __init__(self, config: CyclicLRConfig | None = None) -> None:
        super().__init__(config)
        self.on_warmup_end()

    def on_warmup_end(self) -> None:
        n = self.config.window  # type: ignore[attr-defined]
        self._lr: deque[float] = deque(maxlen=n)
        self._loss: deque[float] = deque(maxlen=n)
        self._seen = 0
        self._rose = False

    def inputs(self) -> tuple[str, ...]:
        return ("learning_rate", "loss")

    def update(self, record: Mapping[str, Any], warmup: bool = False) -> list[Finding]:
        if warmup:
            return []
        c: CyclicLRConfig = self.config  # type: ignore[assignment]
        lr, loss = record.get("learning_rate"), record.get("loss")
        if type(lr) is not float:
            lr = number(record, "learning_rate")
        if type(loss) is not float:
            loss = number(record, "loss")
        if lr is None or loss is None or not math.isfinite(loss):
            return []
        if self._lr and lr > self._lr[-1]:
            self._rose = True
        self._lr.append(lr)
        self._loss.append(loss)
        self._seen += 1
        if not self._rose or self._seen % c.every or len(self._lr) < c.window // 2:
            return []  # a schedule that never rises again after warmup is not cyclic
        lrs = list(self._lr)
        top = max(lrs)
        if top <= 0:
            return []
        swings, _ = zigzag_swings(lrs, 0.2 * top)
        rises = swings // 2  # moves alternate fall/rise; a decay has one move at most
        if rises < c.min_cycles:
            return []
        losses = list(self._loss)
        slope, _ = slope_t(losses)
        mid = (len(losses) - 1) / 2
        detrended = [y - slope * (i - mid) for i, y in enumerate(losses)]
        r = _pearson(lrs, detrended)
        if r > c.correlation:
            return [self.finding(f"loss follows the learning rate through {rises} lr cycles (correlation {r:.2f})",
                                 record, round(r, 3), c.correlation)]
        return []


DETECTORS: dict[str, type[Detector]] = {
    d.name: d for d in (NonFinite, LossSpike, Plateau, Oscillation, Rising, GradExplosion, GradVanishing,
                        AdapterStalled, MemoryPressure, SlowStep, CyclicLR)
}
