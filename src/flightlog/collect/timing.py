"""Step time, data-wait time and throughput, and a step context for plain loops.

The training thread pays two ``perf_counter`` calls and a few additions a step.
Figures are averages over the steps since the last record, so a record every N steps
describes all N of them, not just the last.

    timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt), batch_size=32)
    for batch in timer.data(loader):          # time spent in next() is data-wait time
        with timer.step() as step:            # forward, backward, optimizer step
            loss = ...
            step.log(loss=loss)               # a record every logging_steps steps (no .detach() needed)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from flightlog.collect.collectors import Collectors
    from flightlog.run import Run

_clock = time.perf_counter


class StepClock:
    """Accumulates per-step times and sizes; ``take()`` returns the averages and starts over."""

    __slots__ = ("steps", "step_s", "data_s", "samples", "tokens")

    def __init__(self) -> None:
        self.steps = 0
        self.step_s = 0.0
        self.data_s = 0.0
        self.samples: Any = 0
        self.tokens: Any = 0

    def add(self, step_s: float, data_s: float = 0.0, samples: Any = 0, tokens: Any = 0) -> None:
        self.steps += 1
        self.step_s += step_s
        self.data_s += data_s
        if samples is not None:
            self.samples = self.samples + samples
        if tokens is not None:
            self.tokens = self.tokens + tokens

    def take(self) -> dict[str, Any]:
        """``step_time_s``, ``data_time_s`` and throughputs over the steps since the last call."""
        out = window_averages(self.steps, self.step_s, self.data_s, self.samples, self.tokens, {})
        self.__init__()  # type: ignore[misc]
        return out


def window_averages(steps: int, step_s: float, data_s: float, samples: Any, tokens: Any, into: dict[str, Any]) -> dict[str, Any]:
    """Per-step averages of a window of ``steps`` steps that took ``step_s`` seconds in all
    (``data_s`` of them waiting for data) and processed ``samples``/``tokens``, added to
    ``into`` where it does not have them yet (a value the loop logged itself wins)."""
    if steps == 0:
        return into
    into.setdefault("step_time_s", step_s / steps)
    into.setdefault("data_time_s", data_s / steps)
    if step_s > 0:
        if _nonzero(samples):
            into.setdefault("throughput_samples_per_sec", samples / step_s)
        if _nonzero(tokens):
            # A tensor token count (attention_mask.sum()) stays a tensor: resolved by the writer.
            into.setdefault("throughput_tokens_per_sec", tokens / step_s)
    return into


def _nonzero(value: Any) -> bool:
    return value is not None and (hasattr(value, "shape") or value != 0)


class StepTimer:
    """Times the steps of a plain training loop and emits a metrics record every ``logging_steps``."""

    def __init__(
        self,
        run: "Run",
        *,
        collectors: "Collectors | None" = None,
        logging_steps: int | None = None,
        batch_size: int | None = None,
        tokens_per_step: int | None = None,
        start_step: int = 0,
    ) -> None:
        for name, value in (("logging_steps", logging_steps), ("batch_size", batch_size), ("tokens_per_step", tokens_per_step)):
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"flightlog: StepTimer {name} must be an integer >= 1, got {value!r}")
        if type(start_step) is not int or start_step < 0:
            raise ValueError(f"flightlog: StepTimer start_step must be an integer >= 0, got {start_step!r}")
        self.run = run
        self.collectors = collectors
        if collectors is not None:
            collectors.attach(run)
        self.logging_steps = logging_steps or run.config.logging_steps
        if self.logging_steps % run.config.logging_steps:
            raise ValueError(
                f"flightlog: StepTimer logging_steps={self.logging_steps} is not a multiple of the run's "
                f"logging_steps={run.config.logging_steps}, so the run would drop some of its records"
            )
        self.batch_size = batch_size
        self.tokens_per_step = tokens_per_step
        self.step_count = start_step  # completed steps
        # The window since the last record, kept as running totals that a step adds to
        # with two attribute updates (the averages are worked out at a logging step):
        self._window_start = start_step
        self._busy_s = 0.0  # inside step contexts
        self._data_s = 0.0  # waiting for data (timer.data(), timer.waiting())
        self._overridden = 0  # steps given their own samples/tokens, and those sizes
        self._samples: Any = 0
        self._tokens: Any = 0
        self._context = _Step(self)

    # --------------------------------------------------------------- data wait
    def data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable``, counting the time spent waiting in ``next()`` as data time."""
        iterator = iter(iterable)
        while True:
            t0 = _clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_s += _clock() - t0
            yield item

    def waiting(self) -> "_Waiting":
        """``with timer.waiting(): batch = next(it)`` for loops that fetch data themselves."""
        return _Waiting(self)

    # --------------------------------------------------------------- steps
    def step(self, *, samples: int | None = None, tokens: Any = None) -> "_Step":
        """Context for one optimizer step. ``samples``/``tokens`` override the per-step defaults."""
        ctx = self._context
        if samples is not None or tokens is not None:
            ctx.sizes = (samples, tokens)
        return ctx

    @property
    def next_is_logged(self) -> bool:
        return (self.step_count + 1) % self.logging_steps == 0

    def _count_sizes(self, sizes: tuple[Any, Any]) -> None:
        """A completed step that named its own samples and/or tokens."""
        samples, tokens = sizes
        self._overridden += 1
        self._samples = self._samples + (samples if samples is not None else (self.batch_size or 0))
        self._tokens = self._tokens + (tokens if tokens is not None else (self.tokens_per_step or 0))

    def _take_window(self, into: dict[str, Any]) -> None:
        """Add the averages over the steps since the last record to ``into``; start a new window."""
        steps = self.step_count - self._window_start
        plain = steps - self._overridden  # steps that took the per-step defaults
        samples = self._samples + plain * (self.batch_size or 0)
        tokens = self._tokens + plain * (self.tokens_per_step or 0)
        window_averages(steps, self._busy_s + self._data_s, self._data_s, samples, tokens, into)
        self._window_start = self.step_count
        self._busy_s = self._data_s = 0.0
        self._overridden = 0
        self._samples = self._tokens = 0

    def _emit(self, ctx: "_Step") -> None:
        """A logging step ended: its metrics, the window's averages and the collectors' values."""
        metrics = ctx.metrics
        ctx.metrics = {}
        self._take_window(metrics)
        if self.collectors is not None:
            for key, value in self.collectors.collect(self.step_count).items():
                metrics.setdefault(key, value)
        self.run.log(metrics, step=self.step_count, epoch=ctx.epoch)
        ctx.epoch = None


_ABSENT: Any = object()


class _Step:
    """The reusable context object ``StepTimer.step()`` returns (no allocation per step).

    Every step pays its methods with the caches cold after forward/backward/optimizer
    (each Python operation costs several times its warm micro-benchmark there), so a
    plain step does as little as it can: no dict, no float kept but two running totals,
    no attribute written that a plain step does not change; a logging step does the rest.
    """

    __slots__ = ("timer", "t0", "metrics", "sizes", "epoch", "logged")

    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer
        self.t0 = 0.0
        self.metrics: dict[str, Any] = {}
        self.sizes: tuple[Any, Any] | None = None  # this step's own (samples, tokens), if given
        self.epoch: float | None = None
        self.logged = False

    def __enter__(self) -> "_Step":
        timer = self.timer
        if (timer.step_count + 1) % timer.logging_steps == 0:
            self.logged = True
            if timer.collectors is not None:
                timer.collectors.arm()
        self.t0 = _clock()
        return self

    def log(self, metrics: dict[str, Any] | None = None, *, epoch: float | None = None, loss: Any = _ABSENT, **values: Any) -> None:
        """Metrics of this step (tensors welcome); written only if this step is a logging step.

        (``loss`` is a parameter of its own so that ``step.log(loss=loss)``, the common
        call, builds no keyword dict on the steps that are not logged.)
        """
        if not self.logged:  # kept nowhere: nothing to copy, nothing to clear
            if epoch is not None:
                self.epoch = epoch
            return
        if metrics:
            self.metrics.update(metrics)
        if loss is not _ABSENT:
            self.metrics["loss"] = loss
        if values:
            self.metrics.update(values)
        if epoch is not None:
            self.epoch = epoch

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        elapsed = _clock() - self.t0
        timer = self.timer
        if exc_type is not None:  # the step did not complete: it counts nowhere
            self.metrics.clear()
            self.logged = False
            self.sizes = None
            return
        timer._busy_s += elapsed
        timer.step_count += 1
        if self.sizes is not None:
            timer._count_sizes(self.sizes)
            self.sizes = None
        if self.logged:
            self.logged = False
            timer._emit(self)


class _Waiting:
    __slots__ = ("timer", "t0")

    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer
        self.t0 = 0.0

    def __enter__(self) -> None:
        self.t0 = _clock()

    def __exit__(self, *exc: Any) -> None:
        self.timer._data_s += _clock() - self.t0
