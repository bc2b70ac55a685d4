"""The bundle of built-in collectors an integration (or a plain loop) asks once per record.

Every part is optional and decided once at construction, so ``collect`` does only the
work that was asked for, at logging steps only. Nothing here synchronises with the
device: memory counters are host-side, gradient norms and the GradScaler scale are
tensors that the writer thread resolves, host/NVML metrics are read on the writer
thread (:class:`~flightlog.collect.system.SystemStats`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from flightlog.collect.grads import ADAPTER_PATTERNS, GradNorms
from flightlog.collect.optim import learning_rate, stage, warmup_steps_of
from flightlog.values import SharedVector, snapshot_value

# What Collectors.capture reads on the training thread: learning rate, GradScaler scale,
# (per-gradient norms, how many are adapters'), GPU memory counters.
Captured = tuple[Any, Any, "tuple[SharedVector, int] | None", "dict[str, float] | None"]

if TYPE_CHECKING:
    from flightlog.run import Run


class Collectors:
    """Built-in metrics for a model/optimizer/scheduler; pass what you have, leave out the rest.

    - ``learning_rate`` from ``optimizer``; ``stage`` from ``warmup_steps`` or the scheduler
    - ``grad_norm`` / ``grad_norm_adapter`` / ``grad_norm_backbone`` from ``model`` (``grad_norms=True``),
      computed in an optimizer pre-step hook on logging steps, else when ``capture_grads()`` is called
    - ``precision`` and ``grad_scaler_scale`` (``scaler``)
    - GPU memory from torch.cuda (``gpu=True``; skipped without CUDA) and a
      ``torch.cuda.memory_summary()`` event every ``memory_summary_steps`` steps (0: never)
    - CPU/RAM/disk (psutil) and GPU utilisation/temperature/power (NVML) on the writer thread
      (``system=True``), sampled every ``system_interval_s`` seconds (default 5)
    """

    def __init__(
        self,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        precision: str | None = None,
        warmup_steps: int | None = None,
        grad_norms: bool = True,
        adapter_patterns: Sequence[str] = ADAPTER_PATTERNS,
        gpu: bool = True,
        system: bool = True,
        system_interval_s: float = 5.0,
        memory_summary_steps: int = 1000,
    ) -> None:
        if warmup_steps is not None and (type(warmup_steps) is not int or warmup_steps < 0):
            raise ValueError(f"flightlog: Collectors warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if type(memory_summary_steps) is not int or memory_summary_steps < 0:
            raise ValueError(f"flightlog: Collectors memory_summary_steps must be an integer >= 0 (0 = never), got {memory_summary_steps!r}")
        if type(system_interval_s) not in (int, float) or not system_interval_s >= 0:
            raise ValueError(f"flightlog: Collectors system_interval_s must be a number of seconds >= 0, got {system_interval_s!r}")
        if optimizer is not None and not hasattr(optimizer, "param_groups"):
            raise TypeError(f"flightlog: Collectors optimizer must be a torch optimizer, got {type(optimizer).__name__}")
        from flightlog.collect.device import CudaMemory, cuda_available, detect_precision, precision_name

        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.warmup_steps = warmup_steps if warmup_steps is not None else warmup_steps_of(scheduler)
        self.precision = precision_name(precision) if precision is not None else detect_precision(model, scaler)
        self.grads = GradNorms(model.named_parameters(), adapter_patterns) if (grad_norms and model is not None) else None
        self.memory = CudaMemory() if (gpu and cuda_available()) else None
        self.memory_summary_steps = memory_summary_steps if self.memory is not None else 0
        self.system = system
        self.system_interval_s = float(system_interval_s)
        self.run: "Run | None" = None
        self._armed = False
        self._pending: tuple[SharedVector, int] | None = None
        self._last_summary = 0
        # The optimizer whose pre-step hook computes the norms of a logging step. The hook
        # is registered by arm() and removed by capture(), so the steps in between (and a
        # loop that never arms: the integrations call capture_grads()) pay no Python call.
        self._hooked: Any = None
        self._hook: Any = None
        if self.grads is not None and optimizer is not None:
            inner = optimizer
            # Wrappers (Accelerate's AcceleratedOptimizer, ...) hold the real optimizer, whose hooks fire.
            while not hasattr(inner, "_optimizer_step_pre_hooks") and hasattr(inner, "optimizer"):
                inner = inner.optimizer
            if hasattr(inner, "_optimizer_step_pre_hooks"):
                self._hooked = inner

    # ------------------------------------------------------------------ wiring
    def attach(self, run: "Run") -> None:
        """Bind to a run: adds the writer-thread system processor once."""
        if self.run is run:
            return
        self.run = run
        if self.system:
            from flightlog.collect.system import SystemStats

            stats = SystemStats(run.output_dir, min_interval_s=self.system_interval_s)
            if stats.available:
                run.add_processor(stats)

    def close(self) -> None:
        self._unhook()

    # ------------------------------------------------------------------ gradients
    def arm(self) -> None:
        """The coming optimizer step is a logging step: compute grad norms in its pre-step hook."""
        self._armed = True
        if self._hook is None and self._hooked is not None:
            self._hook = self._hooked.register_step_pre_hook(self._pre_step)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # (The hook stays registered until capture(): removing it here would change the
        # dict the optimizer is iterating over.)
        if self._armed:
            self._armed = False
            self._pending = self.grads.capture()  # type: ignore[union-attr]  (the hook exists only with grads)

    def _unhook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def capture_grads(self) -> None:
        """Compute the gradient norms now (after backward, before zero_grad); used by the next ``collect``."""
        if self.grads is not None:
            self._pending = self.grads.capture()

    # ------------------------------------------------------------------ collect
    def collect(self, step: int) -> dict[str, Any]:
        """Metrics for the record of ``step`` (training thread; cheap; tensors left unresolved)."""
        out: dict[str, Any] = {}
        self.fill(out, step, self.capture(step, snapshot=False))
        return out

    def capture(self, step: int, snapshot: bool = True) -> Captured:
        """The training thread's part of a record: what must be read at this step (the
        learning rate, the scaler's scale, the gradient norms, GPU memory), with device
        tensors' host copies started (``snapshot``), so that :meth:`fill` can build the
        metrics later, on the writer thread."""
        lr = scale = memory = None
        if self.optimizer is not None:
            lr = learning_rate(self.optimizer)
            if snapshot and type(lr) is not float:
                lr = snapshot_value(lr)
        if self.scaler is not None:
            from flightlog.collect.device import scaler_scale

            scale = scaler_scale(self.scaler)
            if snapshot and scale is not None:
                scale = snapshot_value(scale)
        norms = None
        if self.grads is not None:
            norms, self._pending = self._pending, None
            if norms is None:  # no hook ran (no optimizer given, or the scaler skipped the step)
                norms = self.grads.capture()
            if snapshot and norms is not None:
                norms[0].snapshot()
        self._armed = False
        self._unhook()
        if self.memory is not None:
            memory = self.memory.read()
            if self.memory_summary_steps and step - self._last_summary >= self.memory_summary_steps and self.run is not None:
                self._last_summary = step
                self.run.event(self.memory.summary(), level="INFO", source="flightlog/collect", step=step, kind="memory_summary")
        return lr, scale, norms, memory

    def fill(self, metrics: dict[str, Any], step: int, captured: Captured) -> None:
        """Add the metrics of a :meth:`capture` to ``metrics`` where it does not have them
        (a value the loop logged itself wins). Pure arithmetic and formatting: for a
        StepTimer record it runs on the writer thread."""
        lr, scale, norms, memory = captured
        if lr is not None:
            metrics.setdefault("learning_rate", lr)
        current = stage(step, self.warmup_steps)
        if current is not None:
            metrics.setdefault("stage", current)
        if self.precision is not None:
            metrics.setdefault("precision", self.precision)
        if scale is not None:
            metrics.setdefault("grad_scaler_scale", scale)
        if self.grads is not None:
            for key, value in self.grads.derive(norms).items():
                metrics.setdefault(key, value)
        if memory is not None:
            for key, value in memory.items():
                metrics.setdefault(key, value)
