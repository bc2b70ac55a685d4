"""The wandb sink: a bridge to Weights & Biases, online or offline (``WANDB_MODE=offline``).

The W&B run is created at ``run_start`` with flightlog's ``run_id`` as its id (a resumed
flightlog run continues the same W&B run), the run name, the hyper-parameter config
and the task type as a tag. Metrics go in HF's layout: ``train/NAME``, ``eval/NAME``
plotted against ``train/global_step``; non-numeric fields are skipped, NaN stays NaN.
``histograms`` records become ``wandb.Histogram`` values; ``run_end`` finishes the W&B
run with exit code 0 (finished) or 1. Everything W&B does runs on the sink's own
thread, so a slow or unreachable W&B never holds back ``train.jsonl`` or training.

Settings: ``wandb_project`` (default ``WANDB_PROJECT``, else ``flightlog``); the files
go under ``WANDB_DIR`` or the log directory; every other ``WANDB_*`` variable works as
W&B documents it. wandb is imported here only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flightlog.protocol import METRICS, RUN_END, RUN_START
from flightlog.sinks._background import BackgroundSink
from flightlog.sinks._optional import require
from flightlog.sinks._scalars import namespaced, scalar_fields
from flightlog.sinks.base import Record
from flightlog.sinks.histograms import HISTOGRAMS

STEP_KEY = "train/global_step"


class WandbBackend:
    """Owns the W&B run; called from the BackgroundSink's thread only."""

    def __init__(self, *, project: str, directory: Path, run_name: str | None = None) -> None:
        # Checked here so init fails clearly; imported on the sink's thread, not the training thread.
        require("wandb", "wandb", "wandb")
        self.wandb: Any = None
        self.project = project
        self.directory = directory
        self.run_name = run_name
        self.run: Any = None
        self._init_error: BaseException | None = None
        self.finished = False

    def _start(self, record: Record | None) -> None:
        import wandb

        self.wandb = wandb
        record = record or {}
        self.directory.mkdir(parents=True, exist_ok=True)
        tags = [str(record["task_type"])] if record.get("task_type") else None
        config = dict(record.get("config") or {})
        for key in ("model_name", "dataset", "task_type"):
            if record.get(key) is not None:
                config.setdefault(f"flightlog_{key}", record[key])
        kwargs: dict[str, Any] = dict(
            project=self.project,
            dir=str(self.directory),
            name=record.get("run_name") or self.run_name,
            id=record.get("run_id"),
            config=config,
            tags=tags,
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )
        try:
            self.run = wandb.init(reinit="create_new", **kwargs)
        except TypeError:  # wandb < 0.19.10 has no reinit modes
            self.run = wandb.init(reinit=True, **kwargs)
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)

    def send(self, batch: list[Record]) -> None:
        if self._init_error is not None:
            raise self._init_error
        for record in batch:
            kind = record.get("type")
            if self.run is None and not self.finished:
                try:
                    self._start(record if kind == RUN_START else None)
                except Exception as exc:
                    hint = "; set WANDB_MODE=offline to record locally" if "api key" in str(exc).lower() else ""
                    self._init_error = RuntimeError(f"wandb.init failed: {type(exc).__name__}: {exc}{hint}")
                    raise self._init_error from exc
            if self.run is None:
                continue
            step = record.get("step")
            if kind == METRICS:
                data: dict[str, Any] = {namespaced(name): value for name, value in scalar_fields(record)}
                if data:
                    if type(step) is int:
                        data[STEP_KEY] = step
                    self.run.log(data)
            elif kind == HISTOGRAMS and isinstance(record.get(HISTOGRAMS), dict):
                data = {}
                for tag, h in record[HISTOGRAMS].items():
                    edges = [float(h["min"])] + [float(x) for x in h["bucket_limit"]]
                    data[str(tag)] = self.wandb.Histogram(np_histogram=([float(x) for x in h["bucket"]], edges))
                if data:
                    if type(step) is int:
                        data[STEP_KEY] = step
                    self.run.log(data)
            elif kind == RUN_END:
                self.run.finish(exit_code=0 if record.get("status") == "finished" else 1)
                self.run, self.finished = None, True

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def from_config(config: Any, run_dir: Path) -> BackgroundSink:
    project = config.wandb_project or os.environ.get("WANDB_PROJECT") or "flightlog"
    directory = Path(os.environ.get("WANDB_DIR") or run_dir)
    return BackgroundSink(WandbBackend(project=project, directory=directory, run_name=config.run_name), name="wandb")
