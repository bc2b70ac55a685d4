"""Hugging Face ``Trainer`` integration (and so ms-swift, whose trainers subclass it).

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[FlightlogCallback(task_type="sft", dataset="alpaca-en")])

The callback records exactly what the Trainer logs: each ``on_log`` becomes one
metrics record at ``state.global_step`` whose values are the ``state.log_history``
entry's (loss, grad_norm, learning_rate, eval_*, train_runtime...), with the epoch in
the record's ``epoch``. To the training logs it adds the collectors' fields
(step/data time, throughput, stage, precision, adapter/backbone gradient norms, GPU
memory; CPU/RAM/disk on the writer thread). It does not reduce anything across ranks
(the Trainer already averages the loss) and only the main process writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from transformers import TrainerCallback

import flightlog
from flightlog.collect.grads import ADAPTER_PATTERNS
from flightlog.collect.timing import StepClock
from flightlog.integrations._context import jsonable, model_info, model_name
from flightlog.protocol import EVAL_PREFIX, has_eval_metrics

_clock = time.perf_counter


class FlightlogCallback(TrainerCallback):
    """Records a Trainer's run with flightlog.

    ``run``: an existing :class:`flightlog.Run`; by default one is created at
    ``on_train_begin`` in ``args.output_dir`` (``OUTPUT_DIR/logs``) and finished at
    ``on_train_end``. ``task_type``/``dataset``/``run_name``/``model_name`` and any other
    ``flightlog.init`` keyword (``sinks``, ``compress``...) describe the run. ``collect``
    switches the built-in collectors off; ``grad_norms``, ``gpu``, ``system`` and
    ``memory_summary_steps`` switch parts of them.
    """

    def __init__(
        self,
        run: "flightlog.Run | None" = None,
        *,
        task_type: str | None = None,
        dataset: str | None = None,
        run_name: str | None = None,
        model_name: str | None = None,
        collect: bool = True,
        grad_norms: bool = True,
        gpu: bool = True,
        system: bool = True,
        system_interval_s: float = 5.0,
        memory_summary_steps: int = 1000,
        adapter_patterns: Sequence[str] = ADAPTER_PATTERNS,
        finish_on_train_end: bool | None = None,
        **init_options: Any,
    ) -> None:
        if run is not None and not isinstance(run, flightlog.Run):
            raise TypeError(f"flightlog: FlightlogCallback run must be a flightlog.Run, got {type(run).__name__}")
        if run is not None and init_options:
            raise ValueError(f"flightlog: FlightlogCallback got both a run and init options ({', '.join(init_options)}); pass one")
        self.run = run
        self.owns_run = run is None
        self.task_type = task_type
        self.dataset = dataset
        self.run_name = run_name
        self.model_name = model_name
        self.collect = collect
        self.collector_options = dict(
            grad_norms=grad_norms, gpu=gpu, system=system, system_interval_s=system_interval_s,
            memory_summary_steps=memory_summary_steps, adapter_patterns=adapter_patterns,
        )
        self.finish_on_train_end = self.owns_run if finish_on_train_end is None else finish_on_train_end
        self.init_options = init_options
        self.collectors: Any = None
        self.clock = StepClock()
        self._active = False
        self._mark = 0.0  # end of the previous step's bookkeeping (log/eval/save)
        self._data_s = 0.0
        self._samples_per_step = 0
        self._tokens_seen = 0
        self._tokens = 0

    # ------------------------------------------------------------------ start
    def _ensure_run(self, args: Any, state: Any, model: Any, training: bool = False) -> "flightlog.Run | None":
        """The run to write to; None on processes other than the main one.

        A run this callback owns that already finished (``trainer.evaluate()`` after
        ``train()``) is reopened as a new segment of the same run, which only appends.
        """
        if not state.is_world_process_zero:
            return None
        if self.run is not None and not (self.run.finished and self.owns_run):
            return self.run
        reopening = self.run is not None
        self.run = flightlog.init(
            output_dir=args.output_dir,
            run_name=self.run_name or _run_name(args),
            task_type=self.task_type,
            model_name=self.model_name or model_name(model),
            dataset=self.dataset,
            config=self._context(args, state, model),
            logging_steps=1,  # the Trainer decides which steps log
            max_steps=state.max_steps if state.max_steps and state.max_steps > 0 else None,
            # Training that starts past step 0 resumed from a checkpoint: later records of
            # the interrupted segment become superseded. A reopening only appends.
            resumed_from_step=(state.global_step or None) if training else None,
            **self.init_options,
        )
        if reopening and not training:
            self.run.event("run reopened: the Trainer logged after training ended", source="flightlog/hf", step=state.global_step)
        return self.run

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.owns_run and self.run is not None and not self.run.finished:
            self.run.finish("finished")  # a second train() call starts a new segment
        run = self._ensure_run(args, state, model, training=True)
        if run is None:
            return
        self._active = True
        run.save_recorders.add("hf")  # on_save writes the checkpoint records (CheckpointCallback then does not)
        if not self.owns_run:
            run.event("Hugging Face Trainer starts", source="flightlog/hf", config=self._context(args, state, model))
        if self.collect:
            from flightlog.collect.collectors import Collectors

            self.collectors = Collectors(
                model=model,
                precision="bf16" if args.bf16 else "fp16" if args.fp16 else None,
                warmup_steps=args.get_warmup_steps(state.max_steps) if state.max_steps and state.max_steps > 0 else None,
                **self.collector_options,
            )
            self.collectors.attach(run)
        self._samples_per_step = int(state.train_batch_size or args.per_device_train_batch_size) * args.gradient_accumulation_steps * max(1, args.world_size)
        self._tokens_seen = state.num_input_tokens_seen or 0
        run.event(
            f"Training starts: {state.max_steps} steps, logging every {state.logging_steps}, "
            f"{self._samples_per_step} samples per step",
            source="flightlog/hf",
            step=state.global_step,
        )
        self._mark = _clock()

    def _context(self, args: Any, state: Any, model: Any) -> dict[str, Any]:
        """All TrainingArguments at the top level, plus the model and the trainer's schedule."""
        config: dict[str, Any] = jsonable(args.to_dict())
        config["model"] = model_info(model)
        config["trainer"] = jsonable(
            {
                "max_steps": state.max_steps,
                "num_train_epochs": state.num_train_epochs,
                "train_batch_size": state.train_batch_size,
                "logging_steps": state.logging_steps,
                "eval_steps": state.eval_steps,
                "save_steps": state.save_steps,
                "world_size": args.world_size,
                "warmup_steps": args.get_warmup_steps(state.max_steps) if state.max_steps and state.max_steps > 0 else None,
            }
        )
        return config

    # ------------------------------------------------------------------ steps
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._active:
            # The Trainer fetched this step's batches just before: that wait is data time.
            self._data_s = _clock() - self._mark

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._active and self.collectors is not None and self._will_log(args, state, state.global_step + 1):
            self.collectors.capture_grads()

    @staticmethod
    def _will_log(args: Any, state: Any, step: int) -> bool:
        strategy = str(getattr(args.logging_strategy, "value", args.logging_strategy))
        if strategy == "steps":
            return step % max(1, int(state.logging_steps or 1)) == 0 or (step == 1 and bool(args.logging_first_step))
        return strategy == "epoch"  # epoch ends are not known ahead: keep the latest norms

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._active:
            return
        now = _clock()
        tokens = None
        seen = state.num_input_tokens_seen or 0
        if seen > self._tokens_seen:
            tokens, self._tokens_seen = seen - self._tokens_seen, seen
        self.clock.add(now - self._mark, self._data_s, self._samples_per_step, tokens)
        self._data_s = 0.0
        self._mark = now

    # ------------------------------------------------------------------ records
    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        run = self._ensure_run(args, state, kwargs.get("model"))
        if run is None:
            return
        metrics = dict(logs)
        epoch = metrics.pop("epoch", None)
        if self._active and self.collect and "loss" in metrics and not has_eval_metrics(metrics):
            for key, value in self._training_extras(metrics, state.global_step).items():
                metrics.setdefault(key, value)
        run.log(metrics, step=state.global_step, epoch=epoch)
        self._mark = _clock()

    def _training_extras(self, logs: Mapping[str, Any], step: int) -> dict[str, Any]:
        extras = self.clock.take()
        if self.collectors is None:
            return extras
        collected = self.collectors.collect(step)
        hf_norm = logs.get("grad_norm")
        ours = collected.get("grad_norm")
        if ours is not None and isinstance(hf_norm, (int, float)) and "grad_norm_adapter" in collected:
            # Our norms were taken after clipping, which scales every gradient alike:
            # rescale the split to the Trainer's pre-clip grad_norm (on the writer thread).
            target = float(hf_norm)
            collected["grad_norm_adapter"] = collected["grad_norm_adapter"].scaled_to(ours, target)
            collected["grad_norm_backbone"] = collected["grad_norm_backbone"].scaled_to(ours, target)
        extras.update(collected)
        return extras

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        run = self._ensure_run(args, state, kwargs.get("model"))
        if run is None:
            return
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (metrics or {}).items() if k.startswith(EVAL_PREFIX))
        run.event(f"Evaluation at step {state.global_step}: {shown}", source="flightlog/hf", step=state.global_step)
        self._mark = _clock()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self._ensure_run(args, state, kwargs.get("model"))
        if run is None:
            return
        now = _clock()
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        fields: dict[str, Any] = {"seconds": round(now - self._mark, 3)}
        if path.is_dir():
            fields["bytes"] = _dir_bytes(path)
        if state.best_model_checkpoint:
            fields["best_model_checkpoint"] = str(state.best_model_checkpoint)
            fields["best_metric"] = state.best_metric
        run.checkpoint("saved", path, step=state.global_step, **fields)
        self._mark = _clock()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._active and self.run is not None:
            self.run.event(f"Epoch {round(state.epoch or 0)} finished at step {state.global_step}", source="flightlog/hf", step=state.global_step, epoch=state.epoch)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._active or self.run is None:
            return
        self.run.event(f"Training finished at step {state.global_step}", source="flightlog/hf", step=state.global_step)
        if self.collectors is not None:
            self.collectors.close()
        if self.finish_on_train_end:
            self.run.finish("finished")
        else:
            self.run.flush()
        self._active = False


def _run_name(args: Any) -> str | None:
    name = getattr(args, "run_name", None)
    if not name or os.path.normpath(str(name)) == os.path.normpath(str(args.output_dir)):
        return None  # HF's default run name is the output dir; flightlog uses its base name
    return str(name)


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
