"""HF Trainer: resume from the newest *valid* checkpoint, and make HF's checkpoints
verifiable.

HF writes ``checkpoint-N/`` in place (its temp-dir-and-rename save was reverted), and
``resume_from_checkpoint=True`` picks the highest-numbered directory whether or not its
save finished. :class:`CheckpointCallback` seals every checkpoint HF finishes (fsync +
manifest written last, see :func:`flightlog.checkpoint.atomic.seal`), so a save that was
interrupted is recognised; :meth:`CheckpointCallback.resume_from` gives ``Trainer.train``
the newest valid one and reports the others. Saves and loads become ``checkpoint``
records. Composes with ``flightlog.integrations.hf.FlightlogCallback`` (which owns the
run and records the saves itself: by default, ``record_saves=None``, this callback then
leaves them to it; ``True``/``False`` force either way).

    cb = CheckpointCallback()                        # listed after FlightlogCallback
    trainer = Trainer(..., callbacks=[FlightlogCallback(), cb])
    trainer.train(resume_from_checkpoint=cb.resume_from(args.output_dir))
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from flightlog.checkpoint.atomic import seal
from flightlog.checkpoint.find import Verdict, find_latest_valid
from flightlog.checkpoint.resume import record_launch

SEAL_WRITER = "hf"


def latest_valid_checkpoint(output_dir: str | os.PathLike[str]) -> tuple[str | None, list[Verdict]]:
    """The newest complete checkpoint for ``resume_from_checkpoint`` (None: start fresh)."""
    path, skipped = find_latest_valid(output_dir)
    return (str(path) if path is not None else None), skipped


class CheckpointCallback(TrainerCallback):
    """Seal HF checkpoints, record saves/loads, pick the checkpoint to resume from.

    ``run``: the flightlog run to record into (default: ``flightlog.current_run()`` when
    needed). ``resume_arg``: the option the training script takes to resume (recorded
    with the launch command for ``flightlog resume``; None when the script calls
    :meth:`resume_from` itself and is simply re-run). ``continuity_steps``: after a
    resume, compare this many losses with the superseded ones (0: off).
    """

    def __init__(
        self,
        run: Any = None,
        *,
        record_saves: bool | None = None,
        record_launch: bool = True,
        resume_arg: str | None = None,
        continuity_steps: int = 10,
    ) -> None:
        self._run = run
        self.continuity_steps = continuity_steps
        self.continuity: Any = None
        self.record_saves = record_saves
        self.record_launch = record_launch
        self.resume_arg = resume_arg
        self.resumed_from: str | None = None
        self.skipped: list[Verdict] = []
        self._pending_resume_report: tuple[int, float] | None = None
        self._step_end_time: float | None = None
        self._load_start = time.monotonic()

    @property
    def run(self) -> Any:
        if self._run is None:
            import flightlog

            current = flightlog.current_run()
            if current is not None and not current.finished:
                return current
        return self._run

    def resume_from(self, output_dir: str | os.PathLike[str]) -> str | None:
        """Choose the checkpoint to resume from; reported when training begins."""
        self.resumed_from, self.skipped = latest_valid_checkpoint(output_dir)
        self._load_start = time.monotonic()
        return self.resumed_from

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if self.record_launch:
            record_launch(args.output_dir, run=self.run, resume_arg=self.resume_arg)
        if state.global_step > 0:
            if self.resumed_from is None:
                guess = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                self.resumed_from = str(guess) if guess.is_dir() else None
            self._pending_resume_report = (state.global_step, float(state.epoch or 0.0))
        self._report()

    def _report(self) -> None:
        run = self.run
        if run is None:
            return
        while self.skipped:
            verdict = self.skipped.pop(0)
            run.event(f"Skipping checkpoint '{verdict.path}': {verdict.reason}", level="WARNING", source="flightlog/checkpoint")
            run.checkpoint("rejected", verdict.path, step=verdict.step if verdict.step >= 0 else None, reason=verdict.reason)
        if self._pending_resume_report is not None:
            step, epoch = self._pending_resume_report
            self._pending_resume_report = None
            where = self.resumed_from or "?"
            run.event(f"Resuming from checkpoint '{where}'", source="flightlog/checkpoint")
            run.event(f"Loaded state: global_step={step}, epoch={epoch:.2f}, rng_state=restored by Trainer", source="flightlog/checkpoint", step=step)
            if self.resumed_from:
                size = sum(p.stat().st_size for p in Path(self.resumed_from).rglob("*") if p.is_file())
                run.checkpoint("loaded", self.resumed_from, step=step, bytes=size, seconds=round(time.monotonic() - self._load_start, 4))
            if self.continuity_steps:
                from flightlog.checkpoint.continuity import ContinuityCheck

                self.continuity = ContinuityCheck.attach(run, resumed_from_step=step, steps=self.continuity_steps)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pending_resume_report is not None or self.skipped:
            self._report()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_end_time = time.monotonic()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        # HF logs, then saves. Flushing here, when a save follows, puts the records up to
        # the checkpoint on disk before the checkpoint exists: a crash in or after the
        # save cannot leave a gap in the log before the step a resume starts from.
        # (List this callback after the one that logs.)
        run = self.run
        if control.should_save and run is not None:
            run.flush()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not path.is_dir():
            return
        manifest = seal(path, state.global_step, {"writer": SEAL_WRITER})
        run = self.run
        record = self.record_saves if self.record_saves is not None else "hf" not in getattr(run, "save_recorders", ())
        if record and run is not None:
            size = sum(f["bytes"] for f in manifest["files"].values())
            seconds = time.monotonic() - self._step_end_time if self._step_end_time is not None else None
            run.checkpoint("saved", path, step=state.global_step, bytes=size, **({"seconds": round(seconds, 4)} if seconds is not None else {}))
