"""PyTorch Lightning integration: a ``Logger`` for metrics and hyper-parameters, a
``Callback`` for the built-in collectors.

    logger = FlightlogLogger("output", run_name="my-run", task_type="sft")
    trainer = L.Trainer(logger=logger, callbacks=[FlightlogCallback()], log_every_n_steps=10)

The logger writes what Lightning hands its loggers, at the steps Lightning gives (the
same numbers a TensorBoard or CSV logger shows). The callback adds step and data time,
throughput, learning rate and stage, gradient norms (taken in
``on_before_optimizer_step``, after AMP unscaling), precision and GPU memory to the next
training record, only on the steps Lightning will log.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

import flightlog
from flightlog.collect.grads import ADAPTER_PATTERNS
from flightlog.collect.timing import StepClock
from flightlog.integrations._context import jsonable, model_info

_clock = time.perf_counter

_PRECISION = {"16": "fp16", "bf16": "bf16", "32": "fp32", "64": "fp64", "transformer-engine": "fp8"}


def _precision(value: Any) -> str | None:
    text = str(value).split("-")[0]
    return _PRECISION.get(text)


class FlightlogLogger(Logger):
    """A Lightning logger writing to a flightlog run in ``OUTPUT_DIR/logs``.

    The run is created at the first hyper-parameters or metrics Lightning hands over
    (hyper-parameters come first, so they land in ``run_start``), or pass ``run``.
    """

    def __init__(self, output_dir: str = "output", *, run: "flightlog.Run | None" = None, **init_options: Any) -> None:
        super().__init__()
        if run is not None and not isinstance(run, flightlog.Run):
            raise TypeError(f"flightlog: FlightlogLogger run must be a flightlog.Run, got {type(run).__name__}")
        self.output_dir = str(output_dir)
        self.init_options = init_options
        self.owns_run = run is None
        self._run = run
        self._hparams: dict[str, Any] = {}
        self._pending: tuple[int, dict[str, Any]] | None = None

    # Lightning's Logger interface
    # name and version are empty so that ModelCheckpoint (save_dir/name/version/checkpoints)
    # puts checkpoints in OUTPUT_DIR/checkpoints, next to OUTPUT_DIR/logs.
    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return self.output_dir

    @property
    def log_dir(self) -> str:
        return str(self.run.log_dir)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The flightlog Run. Until something is logged this is a stand-in that creates the
        run on first use: Lightning touches ``experiment`` during setup, before it logs the
        hyper-parameters that belong in ``run_start``."""
        return self._run if self._run is not None else _LazyRun(self)

    @property
    def run(self) -> "flightlog.Run":
        """The flightlog Run, created now if it does not exist yet."""
        if self._run is None:
            options = dict(self.init_options)
            if self._hparams:
                options["config"] = {**options.get("config", {}), **self._hparams}
            self._run = flightlog.init(output_dir=self.output_dir, **options)
        return self._run

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        from lightning.fabric.utilities.logger import _convert_params, _sanitize_callable_params

        values = jsonable(_sanitize_callable_params(_convert_params(params)))
        if self._run is None:
            self._hparams.update(values)
        else:
            self._run.event("hyper-parameters", source="flightlog/lightning", config=values)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = dict(metrics)
        epoch = values.pop("epoch", None)
        if self._pending is not None and self._pending[0] == step:
            for key, value in self._pending[1].items():
                values.setdefault(key, value)
            self._pending = None
        self.run.log(values, step=step, epoch=epoch)

    def add_pending(self, step: int, metrics: dict[str, Any]) -> None:
        """Collector metrics to merge into the record Lightning logs next at ``step``."""
        self._pending = (step, metrics)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        path = getattr(checkpoint_callback, "_last_checkpoint_saved", None) or getattr(checkpoint_callback, "last_model_path", None)
        if path:
            import os

            fields: dict[str, Any] = {}
            if os.path.isfile(path):
                fields["bytes"] = os.path.getsize(path)
            best = getattr(checkpoint_callback, "best_model_path", None)
            if best:
                fields["best_model_checkpoint"] = best
            self.run.checkpoint("saved", path, **fields)

    def save(self) -> None:
        """Nothing to do: the writer thread flushes on its own schedule (never block the loop)."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._run is None or not self.owns_run:
            return
        self._run.finish("finished" if status in ("success", "finished") else "failed")


class _LazyRun:
    """Stands for a logger's Run until first use, then forwards to it."""

    def __init__(self, logger: FlightlogLogger) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger.run, name)


class FlightlogCallback(Callback):
    """Adds the built-in collectors' metrics to the training records of a :class:`FlightlogLogger`
    (or logs them itself to the current run when the trainer has no such logger)."""

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        grad_norms: bool = True,
        gpu: bool = True,
        system: bool = True,
        system_interval_s: float = 5.0,
        memory_summary_steps: int = 1000,
        adapter_patterns: Sequence[str] = ADAPTER_PATTERNS,
        warmup_steps: int | None = None,
    ) -> None:
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError(f"flightlog: FlightlogCallback batch_size must be an integer >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.options = dict(
            grad_norms=grad_norms, gpu=gpu, system=system, system_interval_s=system_interval_s,
            memory_summary_steps=memory_summary_steps,
            adapter_patterns=adapter_patterns, warmup_steps=warmup_steps,
        )
        self.collectors: Any = None
        self.logger: FlightlogLogger | None = None
        self.clock = StepClock()
        self._mark = 0.0
        self._data_s = 0.0
        self._samples: Any = None
        self._attached = False

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        from flightlog.collect.collectors import Collectors

        self.logger = next((lg for lg in trainer.loggers if isinstance(lg, FlightlogLogger)), None)
        if self.logger is None and flightlog.current_run() is None:
            raise RuntimeError("flightlog: FlightlogCallback needs a FlightlogLogger on the trainer or an active flightlog run")
        configs = trainer.lr_scheduler_configs
        self.collectors = Collectors(
            model=pl_module,
            # No optimizer hook: Lightning runs the closure (forward/backward) inside
            # optimizer.step, so grads are captured in on_before_optimizer_step instead.
            optimizer=None,
            scheduler=configs[0].scheduler if configs else None,
            precision=_precision(trainer.precision),
            **self.options,
        )
        self.collectors.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._attached = False
        self._mark = _clock()

    def _attach(self, pl_module: Any) -> None:
        # Not in on_fit_start: Lightning logs hyper-parameters after it, and they belong in run_start.
        run = self.logger.run if self.logger is not None else flightlog.current_run()
        if run is None:
            raise RuntimeError("flightlog: FlightlogCallback needs a FlightlogLogger on the trainer or an active flightlog run")
        self.collectors.attach(run)
        run.event(f"Lightning fit starts: {type(pl_module).__name__}", source="flightlog/lightning", model=model_info(pl_module))
        self._attached = True

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.collectors is None:
            return
        if not self._attached:
            self._attach(pl_module)
        self._data_s = _clock() - self._mark
        self._samples = self.batch_size or _batch_len(batch)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.collectors is not None and trainer._logger_connector.should_update_logs:
            self.collectors.capture_grads()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.collectors is None:
            return
        now = _clock()
        self.clock.add(now - self._mark, self._data_s, self._samples)
        if trainer._logger_connector.should_update_logs:
            metrics = self.clock.take()
            metrics.update(self.collectors.collect(trainer.global_step))
            step = trainer.fit_loop.epoch_loop._batches_that_stepped
            if self.logger is not None:
                self.logger.add_pending(step, metrics)
            elif (run := flightlog.current_run()) is not None:
                run.log(metrics, step=step)
        self._mark = _clock()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._mark = _clock()  # validation time is not the next step's data time

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.collectors is not None:
            self.collectors.close()


def _batch_len(batch: Any) -> int | None:
    """The batch size, from the first tensor found (shape only: no device access)."""
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_len(item)
            if size:
                return size
    return None
