"""The mlflow sink: a bridge to an MLflow tracking store (local SQLite by default, or a server).

At ``run_start`` it finds the MLflow run tagged ``flightlog.run_id`` = this run's id in
the experiment (so a resumed flightlog run continues the same MLflow run) or creates
one named after the run, with the flattened hyper-parameter config as params and the
task, model and dataset as tags. Metrics keep flightlog's names (``loss``,
``eval_loss``, ...) at the record's step and time; non-numeric fields are skipped, NaN
stays NaN. ``run_end`` terminates the MLflow run as FINISHED, FAILED or KILLED
(interrupted). It uses ``MlflowClient`` (no global active run, so it never collides
with the user's own ``mlflow.start_run``) on the sink's own thread, so a slow tracking
server never holds back ``train.jsonl`` or training.

Settings: ``mlflow_tracking_uri`` (default ``MLFLOW_TRACKING_URI``, else
``sqlite:///LOG_DIR/mlflow.db``), ``mlflow_experiment`` (default
``MLFLOW_EXPERIMENT_NAME``, else ``flightlog``). mlflow is imported here only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from flightlog.protocol import METRICS, RUN_END, RUN_START
from flightlog.sinks._background import BackgroundSink
from flightlog.sinks._optional import require
from flightlog.sinks._scalars import flatten, record_time, scalar_fields
from flightlog.sinks.base import Record

RUN_ID_TAG = "flightlog.run_id"
BATCH_LIMIT = 1000  # MLflow's log_batch accepts at most 1000 metrics, 100 params
PARAM_LIMIT = 100
MAX_PARAM_CHARS = 6000
_STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_INVALID_KEY = re.compile(r"[^A-Za-z0-9_\-. /:]")


def mlflow_key(name: str) -> str:
    """MLflow accepts letters, digits and ``_-. /:`` in names; anything else becomes ``_``."""
    return _INVALID_KEY.sub("_", name)[:250]


class MlflowBackend:
    """Owns the MLflow run; called from the BackgroundSink's thread only."""

    def __init__(self, *, tracking_uri: str, experiment: str, run_name: str | None = None) -> None:
        # Checked here so init fails clearly; imported (seconds) on the sink's thread, not the training thread.
        require("mlflow", "mlflow", "mlflow")
        self.client: Any = None
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.mlflow_run_id: str | None = None
        self._init_error: BaseException | None = None

    def _start(self, record: Record) -> None:
        from mlflow.tracking import MlflowClient

        client = self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(self.experiment)
        run_id = str(record.get("run_id") or "")
        existing = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'", max_results=1) if run_id else []
        if existing:
            self.mlflow_run_id = existing[0].info.run_id
            client.update_run(self.mlflow_run_id, status="RUNNING")
            return
        tags = {RUN_ID_TAG: run_id}
        for key in ("task_type", "model_name", "dataset"):
            if record.get(key) is not None:
                tags[f"flightlog.{key}"] = str(record[key])
        run = client.create_run(experiment_id, run_name=record.get("run_name") or self.run_name, tags=tags)
        self.mlflow_run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(mlflow_key(k), str(v)[:MAX_PARAM_CHARS]) for k, v in flatten(record.get("config") or {}).items()]
        for i in range(0, len(params), PARAM_LIMIT):
            client.log_batch(self.mlflow_run_id, params=params[i : i + PARAM_LIMIT])

    def send(self, batch: list[Record]) -> None:
        if self._init_error is not None:
            raise self._init_error
        from mlflow.entities import Metric

        metrics: list[Any] = []
        for record in batch:
            kind = record.get("type")
            if kind == RUN_START and self.mlflow_run_id is None:
                try:
                    self._start(record)
                except Exception as exc:
                    self._init_error = RuntimeError(f"cannot start an MLflow run at {self.tracking_uri!r}: {type(exc).__name__}: {exc}")
                    raise self._init_error from exc
            elif kind == METRICS and self.mlflow_run_id is not None:
                step = record.get("step")
                step = step if type(step) is int else 0
                millis = int(record_time(record) * 1000)
                metrics.extend(Metric(mlflow_key(name), value, millis, step) for name, value in scalar_fields(record))
            elif kind == RUN_END and self.mlflow_run_id is not None:
                self._log(metrics)
                metrics = []
                self.client.set_terminated(self.mlflow_run_id, status=_STATUS.get(str(record.get("status")), "FINISHED"))
        self._log(metrics)

    def _log(self, metrics: list[Any]) -> None:
        for i in range(0, len(metrics), BATCH_LIMIT):
            self.client.log_batch(self.mlflow_run_id, metrics=metrics[i : i + BATCH_LIMIT])  # type: ignore[arg-type]

    def close(self) -> None:
        pass


def from_config(config: Any, run_dir: Path) -> BackgroundSink:
    uri = config.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"
    experiment = config.mlflow_experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "flightlog"
    return BackgroundSink(MlflowBackend(tracking_uri=uri, experiment=experiment, run_name=config.run_name), name="mlflow")
