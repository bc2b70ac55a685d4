"""Accelerate integration: a ``GeneralTracker`` that writes ``accelerator.log`` to flightlog.

    tracker = FlightlogTracker(output_dir="output", run_name="my-run", task_type="sft")
    accelerator = Accelerator(log_with=[tracker])
    accelerator.init_trackers("project", config=hyper_parameters)   # -> run_start's config
    ...
    accelerator.log({"loss": loss}, step=step)                      # -> a metrics record
    accelerator.end_training()                                      # -> run_end

The run is created when the configuration arrives (so it lands in ``run_start``), or
at the first ``log`` without one. Accelerate calls trackers on the main process only.
For step time, data time and the collectors in the same loop, wrap it in
:class:`flightlog.collect.StepTimer` on ``tracker.run``.
"""

from __future__ import annotations

from typing import Any

from accelerate.tracking import GeneralTracker

import flightlog
from flightlog.integrations._context import jsonable


class FlightlogTracker(GeneralTracker):
    name = "flightlog"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, output_dir: str = "output", *, run: "flightlog.Run | None" = None, **init_options: Any) -> None:
        super().__init__()
        if run is not None and not isinstance(run, flightlog.Run):
            raise TypeError(f"flightlog: FlightlogTracker run must be a flightlog.Run, got {type(run).__name__}")
        self.output_dir = output_dir
        self.init_options = init_options
        self.owns_run = run is None
        self._run = run

    @property
    def tracker(self) -> "flightlog.Run":
        """The flightlog Run (created on first use)."""
        return self.run

    @property
    def run(self) -> "flightlog.Run":
        if self._run is None:
            self._run = flightlog.init(output_dir=self.output_dir, **self.init_options)
        return self._run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        config = jsonable(dict(values))
        if self._run is None:
            options = dict(self.init_options)
            options["config"] = {**options.get("config", {}), **config}
            self._run = flightlog.init(output_dir=self.output_dir, **options)
        else:
            self._run.event("hyper-parameters", source="flightlog/accelerate", config=config)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        values = dict(values)
        epoch = values.pop("epoch", None)
        self.run.log(values, step=step, epoch=epoch if isinstance(epoch, (int, float)) else None)

    def finish(self) -> None:
        if self._run is not None and self.owns_run:
            self._run.finish("finished")
