"""CheckpointManager: saves and restores everything a plain PyTorch loop needs to
continue exactly where it stopped, and owns its own schedule.

    mgr = CheckpointManager("output", model=model, optimizer=opt, scheduler=sched, save_steps=50)
    run = mgr.init_run(run_name="exp1", max_steps=500)   # resumes if a valid checkpoint exists
    step = mgr.global_step
    for epoch in range(mgr.epoch, epochs):
        for batch in mgr.epoch_batches(loader, epoch):      # same batches after a resume
            ...; step += 1
            run.log({"loss": loss}, step=step)
            mgr.step(step)                                   # saves at multiples of save_steps
    mgr.close()

The loop never decides when to save (torchtitan's shape). A checkpoint is written
atomically (:mod:`flightlog.checkpoint.atomic`) in HF's ``checkpoint-N/`` layout.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightlog.checkpoint.atomic import CheckpointWriter, Committed, sweep_leftovers
from flightlog.checkpoint.data import set_epoch, skip_batches
from flightlog.checkpoint.find import TRAINER_STATE, Verdict, checkpoint_dir, find_latest_valid, validate
from flightlog.checkpoint.retention import apply_retention
from flightlog.checkpoint.state import load_weights, model_weights, rng_state, set_rng_state

WEIGHTS = "pytorch_model.bin"
ADAPTER_WEIGHTS = "adapter_model.bin"


@dataclass
class Position:
    """Where training stands: the last finished optimizer step and the data position."""

    global_step: int = 0
    epoch: int = 0
    batches_consumed: int = 0
    """Batches of ``epoch`` already trained on."""
    epoch_float: float = 0.0


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor copied to host memory (the async save's snapshot)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_cpu_copy(v) for v in obj]
        return type(obj)(items) if isinstance(obj, list) else tuple(items)
    return copy.deepcopy(obj)


def _plain_numpy_state(state: dict[str, Any]) -> dict[str, Any]:
    """NumPy's RNG state as plain Python values, so ``torch.load(weights_only=True)`` reads it."""
    if "numpy" in state:
        name, keys, pos, has_gauss, gauss = state["numpy"]
        state = {**state, "numpy": (name, [int(k) for k in keys], int(pos), int(has_gauss), float(gauss))}
    return state


def _numpy_state_back(state: dict[str, Any]) -> dict[str, Any]:
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, gauss = state["numpy"]
        state = {**state, "numpy": (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss)}
    return state


class CheckpointManager:
    """Saves at every ``save_steps``-th step and restores the newest valid checkpoint.

    ``adapter_only`` saves only trainable parameters (or those a predicate on the
    canonical name accepts). ``data_loader`` is saved by its own ``state_dict`` when it
    has one (torchdata's ``StatefulDataLoader``); otherwise the position is the epoch
    and the batches consumed, tracked by :meth:`epoch_batches`. ``extra`` names more
    objects with ``state_dict``/``load_state_dict`` (an EMA, a custom sampler).
    ``progress(step, stage)`` is called as a save proceeds (see ``CheckpointWriter``).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        save_steps: int,
        save_total_limit: int | None = None,
        metric_for_best: str | None = None,
        greater_is_better: bool = False,
        adapter_only: bool | Callable[[str], bool] = False,
        data_loader: Any = None,
        extra: Mapping[str, Any] | None = None,
        async_save: bool = False,
        max_steps: int | None = None,
        config: Mapping[str, Any] | None = None,
        run: Any = None,
        progress: Callable[[int, str], None] | None = None,
    ) -> None:
        if type(save_steps) is not int or save_steps < 1:
            raise ValueError(f"flightlog: save_steps must be an integer >= 1, got {save_steps!r}")
        if save_total_limit is not None and (type(save_total_limit) is not int or save_total_limit < 1):
            raise ValueError(f"flightlog: save_total_limit must be an integer >= 1 or None, got {save_total_limit!r}")
        for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler), *(extra or {}).items()):
            if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"flightlog: {name} must have state_dict() and load_state_dict(), got {type(obj).__name__}")
        self.output_dir = Path(output_dir)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.save_steps = save_steps
        self.save_total_limit = save_total_limit
        self.metric_for_best = metric_for_best
        self.greater_is_better = greater_is_better
        self.adapter_only = adapter_only
        self.data_loader = data_loader
        self.extra = dict(extra or {})
        self.async_save = async_save
        self.max_steps = max_steps
        self.config = dict(config or {})
        self.run = run
        self.progress = progress
        self.rank, self.world_size = _rank_world()

        self.position = Position()
        self.resumed_from: Path | None = None
        self.best_metric: float | None = None
        self.best_checkpoint: str | None = None
        self.best_step: int | None = None
        self.log_history: list[dict[str, Any]] = []
        self._skip_on_resume: int | None = None  # batches to skip in the resumed epoch
        self._steps_in_epoch: int | None = None
        self._pending: threading.Thread | None = None
        self._pending_error: BaseException | None = None
        self.last_saved: Committed | None = None
        if self.rank == 0:
            sweep_leftovers(self.output_dir)

    # ------------------------------------------------------------------ convenience
    @property
    def global_step(self) -> int:
        return self.position.global_step

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def find(self) -> tuple[Path | None, list[Verdict]]:
        """The newest valid checkpoint and the newer ones skipped (with reasons)."""
        return find_latest_valid(self.output_dir)

    def init_run(self, **init_kwargs: Any) -> Any:
        """Start the flightlog run, resuming from the newest valid checkpoint if there is one.

        Finds the checkpoint first (so ``run_start`` carries ``resumed_from_step``),
        records the launch command in ``OUTPUT_DIR/resume.sh``, reports skipped
        checkpoints, restores the state, and arms the continuity check.
        """
        import flightlog
        from flightlog.checkpoint.continuity import ContinuityCheck
        from flightlog.checkpoint.resume import record_launch

        from flightlog.config import FIELDS, build_config
        from flightlog.runfile import read_run_file

        path, skipped = self.find()
        step = validate(path).step if path is not None else None
        init_kwargs.setdefault("output_dir", str(self.output_dir))
        if self.max_steps is not None:
            init_kwargs.setdefault("max_steps", self.max_steps)
        continuity = init_kwargs.pop("continuity_steps", 10)
        restarted = False
        options = {k: v for k, v in init_kwargs.items() if k in FIELDS or k == "config_file"}
        if step is None and read_run_file(build_config(**options).resolved_log_dir) is not None:
            # The run was started before but left no valid checkpoint: it starts over, and
            # everything the earlier segments logged is superseded.
            step, restarted = 0, True
        run = flightlog.init(resumed_from_step=step, **init_kwargs)
        self.run = run
        record_launch(self.output_dir, run=run)
        for verdict in skipped:
            report_rejected(run, verdict)
        if restarted:
            run.event(f"No valid checkpoint in '{self.output_dir}': starting again from step 0", level="WARNING", source="flightlog/checkpoint")
        if path is not None:
            self.restore(path)
            if continuity:
                ContinuityCheck.attach(run, resumed_from_step=self.global_step, steps=continuity)
        return run

    # ------------------------------------------------------------------ data position
    def epoch_batches(self, loader: Any, epoch: int) -> Iterator[Any]:
        """The batches of ``epoch``: sets the sampler's epoch, skips what a resumed
        checkpoint already consumed, and tracks the position for the next save."""
        set_epoch(loader, epoch)
        skip = 0
        if self._skip_on_resume is not None and epoch == self.position.epoch:
            skip = self._skip_on_resume
        self._skip_on_resume = None
        try:
            self._steps_in_epoch = len(loader)
        except TypeError:
            self._steps_in_epoch = None
        self.position.epoch = epoch
        self.position.batches_consumed = skip
        if skip:
            # Starting an iterator draws a base seed from the global torch RNG. The
            # uninterrupted run drew it when the epoch began, before the checkpoint, so
            # the restored RNG state must not be consumed by it a second time.
            import torch

            saved = torch.get_rng_state()
            iterator = iter(skip_batches(loader, skip))
            torch.set_rng_state(saved)
        else:
            iterator = iter(loader)
        for batch in iterator:
            self.position.batches_consumed += 1
            yield batch

    def _epoch_float(self) -> float:
        if self._steps_in_epoch:
            return self.position.epoch + self.position.batches_consumed / self._steps_in_epoch
        return float(self.position.epoch)

    # ------------------------------------------------------------------ saving
    def step(self, step: int, *, epoch: float | None = None, metrics: Mapping[str, Any] | None = None) -> Path | None:
        """Call once per optimizer step; saves when ``step`` is a multiple of ``save_steps``
        or equals ``max_steps``. Returns the checkpoint path when it saved."""
        self.position.global_step = step
        if step % self.save_steps == 0 or (self.max_steps is not None and step == self.max_steps):
            return self.save(step, epoch=epoch, metrics=metrics)
        return None

    def save(self, step: int, *, epoch: float | None = None, metrics: Mapping[str, Any] | None = None) -> Path:
        """Write ``checkpoint-<step>`` now (in the background with ``async_save``)."""
        self.wait()
        if self.run is not None and self.rank == 0:
            # A checkpoint never gets ahead of the log: the records up to this step are on
            # disk before the checkpoint exists, so a kill cannot leave a gap before it.
            self.run.flush()
        self.position.global_step = step
        self.position.epoch_float = float(epoch) if epoch is not None else self._epoch_float()
        if metrics:
            self.log_history.append({"step": step, "epoch": self.position.epoch_float, **_plain(metrics)})
            self._update_best(step, metrics)
        start = time.monotonic()
        state = self._collect(copy_to_cpu=self.async_save)
        final = checkpoint_dir(self.output_dir, step)
        if self.rank != 0:
            self._barrier()
            return final
        if self.async_save:
            blocking = time.monotonic() - start
            self._pending = threading.Thread(target=self._write_guarded, args=(final, step, state, blocking), name="flightlog-checkpoint", daemon=False)
            self._pending.start()
        else:
            self._write(final, step, state, None)
        self._barrier()
        return final

    def _update_best(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.metric_for_best or self.metric_for_best not in metrics:
            return
        value = float(metrics[self.metric_for_best])
        if value != value:
            return
        better = self.best_metric is None or (value > self.best_metric if self.greater_is_better else value < self.best_metric)
        if better:
            self.best_metric, self.best_step = value, step
            self.best_checkpoint = str(checkpoint_dir(self.output_dir, step))

    def _collect(self, copy_to_cpu: bool) -> dict[str, Any]:
        """Everything to write, as host objects (copied when written in the background)."""
        take = _cpu_copy if copy_to_cpu else (lambda x: x)
        state: dict[str, Any] = {"weights": take(model_weights(self.model, self.adapter_only))}
        for name in ("optimizer", "scheduler", "scaler"):
            obj = getattr(self, name)
            if obj is not None:
                state[name] = take(obj.state_dict())
        if self.extra:
            state["extra"] = {name: take(obj.state_dict()) for name, obj in self.extra.items()}
        rng = _plain_numpy_state(rng_state())
        if self.world_size > 1:
            import torch.distributed as dist

            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, rng)
            state["rng"] = gathered
        else:
            state["rng"] = [rng]
        data: dict[str, Any] = {
            "epoch": self.position.epoch,
            "batches_consumed": self.position.batches_consumed,
            "steps_in_epoch": self._steps_in_epoch,
        }
        if self.data_loader is not None and hasattr(self.data_loader, "state_dict"):
            data["loader"] = take(self.data_loader.state_dict())
        state["data"] = data
        state["trainer_state"] = self._trainer_state()
        return state

    def _trainer_state(self) -> dict[str, Any]:
        run_id = getattr(self.run, "run_id", None)
        return {
            "global_step": self.position.global_step,
            "epoch": self.position.epoch_float,
            "max_steps": self.max_steps,
            "save_steps": self.save_steps,
            "best_metric": self.best_metric,
            "best_model_checkpoint": self.best_checkpoint,
            "best_global_step": self.best_step,
            "log_history": list(self.log_history),
            "config": self.config,
            "flightlog": {
                "run_id": run_id,
                "metric_for_best": self.metric_for_best,
                "greater_is_better": self.greater_is_better,
                "adapter_only": bool(self.adapter_only),
                "world_size": self.world_size,
                "data": {"epoch": self.position.epoch, "batches_consumed": self.position.batches_consumed},
            },
        }

    def _write_guarded(self, final: Path, step: int, state: dict[str, Any], blocking: float) -> None:
        try:
            self._write(final, step, state, blocking)
        except BaseException as exc:  # reported by wait() on the training thread
            self._pending_error = exc

    def _write(self, final: Path, step: int, state: dict[str, Any], blocking: float | None) -> None:
        import torch

        user_progress = self.progress
        writer = CheckpointWriter(final, step=step, progress=(lambda stage: user_progress(step, stage)) if user_progress else None)
        try:
            save = lambda obj: (lambda path: torch.save(obj, path))  # noqa: E731
            writer.write_with(ADAPTER_WEIGHTS if self.adapter_only else WEIGHTS, save(state["weights"]))
            for name, file in (("optimizer", "optimizer.pt"), ("scheduler", "scheduler.pt"), ("scaler", "scaler.pt")):
                if name in state:
                    writer.write_with(file, save(state[name]))
            if "extra" in state:
                writer.write_with("extra_state.pt", save(state["extra"]))
            rngs = state["rng"]
            if len(rngs) == 1:
                writer.write_with("rng_state.pth", save(rngs[0]))
            else:
                for rank, rng in enumerate(rngs):
                    writer.write_with(f"rng_state_{rank}.pth", save(rng))
            writer.write_with("data_state.pt", save(state["data"]))
            writer.write_bytes(TRAINER_STATE, json.dumps(state["trainer_state"], indent=2, default=str).encode())
            committed = writer.commit({"writer": "flightlog", "world_size": self.world_size})
        except BaseException:
            writer.abort()
            raise
        self.last_saved = committed
        if self.run is not None:
            extra = {} if blocking is None else {"blocking_seconds": round(blocking, 4)}
            self.run.checkpoint("saved", committed.path, bytes=committed.bytes, seconds=round(committed.seconds, 4), step=step, **extra)
        if self.save_total_limit is not None:
            removed = apply_retention(
                self.output_dir,
                self.save_total_limit,
                keep=[p for p in (self.best_checkpoint, self.resumed_from) if p],
            )
            if self.run is not None:
                for path in removed:
                    self.run.event(f"Deleting older checkpoint [{path}] due to save_total_limit={self.save_total_limit}", source="flightlog/checkpoint")

    def wait(self) -> None:
        """Block until a background save has finished; re-raise its error if it failed."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise RuntimeError(f"flightlog: background checkpoint save failed: {error}") from error

    def close(self) -> None:
        self.wait()

    def _barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    # ------------------------------------------------------------------ restoring
    def restore(self, path: str | os.PathLike[str] | None = None) -> Position:
        """Load a checkpoint (default: the newest valid one) into every attached object."""
        import torch

        start = time.monotonic()
        if path is None:
            path, skipped = self.find()
            for verdict in skipped:
                report_rejected(self.run, verdict)
            if path is None:
                raise FileNotFoundError(f"flightlog: no valid checkpoint in {str(self.output_dir)!r}")
        path = Path(path)
        verdict = validate(path, require_manifest=True)
        if not verdict.ok:
            report_rejected(self.run, verdict)
            raise ValueError(f"flightlog: cannot resume from {str(path)!r}: {verdict.reason}")
        if self.run is not None:
            self.run.event(f"Resuming from checkpoint '{path}'", source="flightlog/checkpoint")
        load = lambda name: torch.load(path / name, map_location="cpu", weights_only=True)  # noqa: E731
        trainer_state = json.loads((path / TRAINER_STATE).read_text())
        adapter = (path / ADAPTER_WEIGHTS).exists()
        load_weights(self.model, load(ADAPTER_WEIGHTS if adapter else WEIGHTS), adapter_only=adapter)
        for name, file in (("optimizer", "optimizer.pt"), ("scheduler", "scheduler.pt"), ("scaler", "scaler.pt")):
            obj = getattr(self, name)
            if obj is None:
                continue
            if not (path / file).exists():
                raise FileNotFoundError(f"flightlog: {path} has no {file} but a {name} was given to the manager")
            obj.load_state_dict(load(file))
        if self.extra:
            saved = load("extra_state.pt") if (path / "extra_state.pt").exists() else {}
            for name, obj in self.extra.items():
                if name not in saved:
                    raise KeyError(f"flightlog: {path} holds no extra state {name!r}")
                obj.load_state_dict(saved[name])
        data = load("data_state.pt")
        if "loader" in data and self.data_loader is not None:
            self.data_loader.load_state_dict(data["loader"])
            self._skip_on_resume = None
        else:
            self._skip_on_resume = int(data["batches_consumed"])
        rng_file = path / (f"rng_state_{self.rank}.pth" if self.world_size > 1 else "rng_state.pth")
        if not rng_file.exists():
            raise FileNotFoundError(f"flightlog: {path} has no {rng_file.name} (saved with another world size?)")
        rng = _numpy_state_back(torch.load(rng_file, weights_only=True))
        set_rng_state(rng)

        self.position = Position(
            global_step=int(trainer_state["global_step"]),
            epoch=int(data["epoch"]),
            batches_consumed=int(data["batches_consumed"]),
            epoch_float=float(trainer_state.get("epoch") or 0.0),
        )
        self._steps_in_epoch = data.get("steps_in_epoch")
        self.best_metric = trainer_state.get("best_metric")
        self.best_checkpoint = trainer_state.get("best_model_checkpoint")
        self.best_step = trainer_state.get("best_global_step")
        self.log_history = list(trainer_state.get("log_history") or [])
        self.resumed_from = path
        if self.run is not None:
            parts = ", ".join(sorted(rng))
            self.run.event(
                f"Loaded state: global_step={self.position.global_step}, epoch={self.position.epoch_float:.2f}, "
                f"rng_state=restored ({parts}), data=epoch {self.position.epoch} batch {self.position.batches_consumed}",
                source="flightlog/checkpoint",
                step=self.position.global_step,
            )
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            self.run.checkpoint("loaded", path, bytes=size, seconds=round(time.monotonic() - start, 4), step=self.position.global_step)
        return self.position


def report_rejected(run: Any, verdict: Verdict) -> None:
    """A skipped checkpoint becomes a ``rejected`` record and a warning that says why."""
    if run is None:
        return
    run.event(f"Skipping checkpoint '{verdict.path}': {verdict.reason}", level="WARNING", source="flightlog/checkpoint")
    run.checkpoint("rejected", verdict.path, step=verdict.step if verdict.step >= 0 else None, reason=verdict.reason)


def _plain(metrics: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        out[str(key)] = value
    return out
