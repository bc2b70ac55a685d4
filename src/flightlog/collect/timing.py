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

from flightlog.values import Derived, resolve_together

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
    """Times the steps of a plain training loop and emits a metrics record every ``logging_steps``.

    The training thread pays, on a plain step, the step context's two clock reads and a
    few slot updates on one object; on a logging step it reads what must be read then
    (the loss, the learning rate, the gradient norms' vector) and hands it over; the
    record itself (the window's averages, the stage, the derived norms) is put together
    on the writer thread (:meth:`flightlog.Run._log_built`), or here when the run has
    ``on_log`` hooks or reduces across ranks (they need the whole record at once).
    """

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
        # The window since the last record: the step context keeps the running totals (the
        # averages are worked out for the record); steps that named their own sizes here.
        self._window_start = 0
        self._overridden = 0
        self._samples: Any = 0
        self._tokens: Any = 0
        self._context = _Step(self)
        self.step_count = start_step  # (also the step context's next logging step)
        from flightlog.run import Run

        # A plain Run takes records the writer thread puts together; a subclass (a
        # distributed run reduces the record across ranks) gets whole ones.
        self._builds_on_writer = type(run) is Run

    @property
    def step_count(self) -> int:
        """Completed steps (``start_step`` plus the steps run since)."""
        return self._context.step_count

    @step_count.setter
    def step_count(self, value: int) -> None:
        """Continue from ``value`` completed steps (a resumed loop): the window starts over."""
        if type(value) is not int or value < 0:
            raise ValueError(f"flightlog: StepTimer step_count must be an integer >= 0, got {value!r}")
        ctx = self._context
        ctx.step_count = self._window_start = value
        ctx.log_at = (value // self.logging_steps + 1) * self.logging_steps
        ctx.busy_s = ctx.data_s = 0.0

    # --------------------------------------------------------------- data wait
    def data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable``, counting the time spent waiting in ``next()`` as data time."""
        ctx = self._context
        iterator = iter(iterable)
        while True:
            t0 = _clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            ctx.data_s += _clock() - t0
            yield item

    def waiting(self) -> "_Waiting":
        """``with timer.waiting(): batch = next(it)`` for loops that fetch data themselves."""
        return _Waiting(self._context)

    # --------------------------------------------------------------- steps
    def step(self, *, samples: int | None = None, tokens: Any = None) -> "_Step":
        """Context for one optimizer step. ``samples``/``tokens`` override the per-step defaults."""
        ctx = self._context
        if samples is not None or tokens is not None:
            ctx.sizes = (samples, tokens)
        return ctx

    @property
    def next_is_logged(self) -> bool:
        return self._context.step_count + 1 == self._context.log_at

    def _count_sizes(self, sizes: tuple[Any, Any]) -> None:
        """A completed step that named its own samples and/or tokens."""
        samples, tokens = sizes
        self._overridden += 1
        self._samples = self._samples + (samples if samples is not None else (self.batch_size or 0))
        self._tokens = self._tokens + (tokens if tokens is not None else (self.tokens_per_step or 0))

    def _take_window(self, ctx: "_Step") -> tuple[int, float, float, Any, Any]:
        """The window since the last record: (steps, seconds, of them waiting for data,
        samples, tokens), for :func:`window_averages`; a new window starts."""
        steps = ctx.step_count - self._window_start
        plain = steps - self._overridden  # steps that took the per-step defaults
        window = (
            steps, ctx.busy_s + ctx.data_s, ctx.data_s,
            self._samples + plain * (self.batch_size or 0), self._tokens + plain * (self.tokens_per_step or 0),
        )
        self._window_start = ctx.step_count
        ctx.busy_s = ctx.data_s = 0.0
        self._overridden = 0
        self._samples = self._tokens = 0
        return window

    def _emit(self, ctx: "_Step") -> None:
        """A logging step ended: hand its metrics, the window and the collectors' readings over."""
        metrics = ctx.metrics
        ctx.metrics = {}
        step, epoch = ctx.step_count, ctx.epoch
        ctx.epoch = None
        window = self._take_window(ctx)
        collectors = self.collectors
        run = self.run
        samples, tokens = window[3], window[4]
        on_writer = self._builds_on_writer and not run._hooks and type(samples) is int and type(tokens) is int
        # Built on the writer: device tensors start their host copies now. Built here:
        # left as they are for run.log (a distributed run reduces them on the device).
        captured = collectors.capture(step, snapshot=on_writer) if collectors is not None else None
        args = (metrics, window, collectors, captured, step)
        if on_writer:
            run._log_built(build_step_records, args, step, epoch)
        else:  # the whole record now: hooks and reductions see it; tensor sizes divide here
            run.log(build_step_record(*args), step=step, epoch=epoch)


def build_step_record(metrics: dict[str, Any], window: tuple[int, float, float, Any, Any], collectors: "Collectors | None", captured: Any, step: int) -> dict[str, Any]:
    """A StepTimer record: the loop's own metrics, then (where the loop did not log them)
    the window's averages and the collectors' metrics."""
    window_averages(*window, metrics)
    if collectors is not None:
        collectors.fill(metrics, step, captured)
    return metrics


def build_step_records(args: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """StepTimer's records, put together on the writer thread (a drained chunk's at once:
    see :data:`flightlog.pipeline.queue.BUILT_METRICS`). The chunk's CPU norm vectors are
    read together, and derived values become numbers now, so that the writer finishes
    these records on its all-plain-values path; one that cannot be read stays for it to
    report by name."""
    vectors = []
    for _metrics, _window, _collectors, captured, _step in args:
        if captured is not None and captured[2] is not None:
            vectors.append(captured[2][0])  # (lr, scale, (norm vector, adapters), memory)
    resolve_together(vectors)
    records = [build_step_record(*a) for a in args]
    for metrics in records:
        for key, value in metrics.items():
            if type(value) is Derived:
                try:
                    metrics[key] = value.value()
                except Exception:
                    pass
    return records


_ABSENT: Any = object()


class _Step:
    """The reusable context object ``StepTimer.step()`` returns (no allocation per step),
    and the holder of the step count and the window's running totals.

    Every step pays its methods with the caches cold after forward/backward/optimizer
    (each Python operation costs several times its warm micro-benchmark there), so a
    plain step touches this one object only: two clock reads, two additions, no dict, no
    attribute written that a plain step does not change; a logging step does the rest.
    """

    __slots__ = ("timer", "t0", "step_count", "log_at", "busy_s", "data_s", "metrics", "sizes", "epoch", "logged")

    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer
        self.t0 = 0.0
        self.step_count = 0  # completed steps (StepTimer.step_count sets it and log_at)
        self.log_at = 0  # the next logged step
        self.busy_s = 0.0  # the window's time inside step contexts
        self.data_s = 0.0  # and waiting for data (timer.data(), timer.waiting())
        self.metrics: dict[str, Any] = {}
        self.sizes: tuple[Any, Any] | None = None  # this step's own (samples, tokens), if given
        self.epoch: float | None = None
        self.logged = False

    def __enter__(self) -> "_Step":
        if self.step_count + 1 == self.log_at:
            self.logged = True
            collectors = self.timer.collectors
            if collectors is not None:
                collectors.arm()
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
        if exc_type is not None:  # the step did not complete: it counts nowhere
            self.metrics.clear()
            self.logged = False
            self.sizes = None
            return
        self.busy_s += _clock() - self.t0
        self.step_count += 1
        if self.sizes is not None:
            self.timer._count_sizes(self.sizes)
            self.sizes = None
        if self.logged:
            self.logged = False
            self.log_at += self.timer.logging_steps
            self.timer._emit(self)


class _Waiting:
    __slots__ = ("ctx", "t0")

    def __init__(self, ctx: _Step) -> None:
        self.ctx = ctx
        self.t0 = 0.0

    def __enter__(self) -> None:
        self.t0 = _clock()

    def __exit__(self, *exc: Any) -> None:
        self.ctx.data_s += _clock() - self.t0
