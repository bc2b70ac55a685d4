"""FlightlogCallback and CheckpointCallback on one HF Trainer, in the documented order
(tiny Llama from a config, CPU): a run stopped after step 6, then a second
``trainer.train(resume_from_checkpoint=cb.resume_from(...))`` from checkpoint-4."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flightlog.checkpoint.hf import CheckpointCallback
from flightlog.integrations.hf import FlightlogCallback
from flightlog.store.reader import tagged_records


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, length: int = 12) -> None:
        self.ids = torch.randint(0, 64, (n, length), generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StopAt(transformers.TrainerCallback):
    """Ends the first train() after step N without a save: checkpoint-4 is then mid-run."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True
            control.should_save = False


def trainer(out: Path, stop_at: int | None) -> tuple[Any, CheckpointCallback]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=10, per_device_train_batch_size=4, logging_steps=1, save_steps=4,
        learning_rate=3e-3, seed=0, data_seed=0, report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )
    ckpt = CheckpointCallback(continuity_steps=2)  # the default: saves left to FlightlogCallback
    callbacks = [FlightlogCallback(sinks=["jsonl"], install_signal_handlers=False), ckpt, StopAt(stop_at)]
    return transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args, train_dataset=Tokens(), callbacks=callbacks), ckpt


@pytest.mark.slow
@pytest.mark.parametrize("same_trainer", [False, True], ids=["rerun", "same-trainer"])
def test_both_callbacks_one_run_through_a_resume(tmp_path: Path, same_trainer: bool) -> None:
    """One run in two segments; the resumed segment's metrics are the resumed trainer's
    log_history; one checkpoint record per save; continuity exact; no ERROR event.
    ``rerun``: a new Trainer and new callbacks (the script run again); ``same-trainer``:
    train() called again on the first Trainer with its callbacks."""
    torch.set_num_threads(1)
    out = tmp_path / "out"
    first, ckpt = trainer(out, stop_at=6)
    first.train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]

    if same_trainer:
        second = first
        next(cb for cb in first.callback_handler.callbacks if isinstance(cb, StopAt)).step = None
    else:
        second, ckpt = trainer(out, stop_at=None)
    chosen = ckpt.resume_from(out)
    assert chosen == str(out / "checkpoint-4")
    second.train(resume_from_checkpoint=chosen)

    tagged = list(tagged_records(out / "logs"))
    starts = [r for _, r in tagged if r["type"] == "run_start"]
    assert [s["segment"] for s in starts] == [0, 1] and len({s["run_id"] for s in starts}) == 1
    assert starts[1]["resumed_from_step"] == 4

    resumed_history = [e for e in second.state.log_history if e["step"] > 4]
    metrics = [r for s, r in tagged if s == 1 and r["type"] == "metrics"]
    assert len(metrics) == len(resumed_history) == 7  # steps 5..10 and the train_runtime summary
    for entry, record in zip(resumed_history, metrics):
        assert record["step"] == entry["step"] and record["epoch"] == entry["epoch"]
        for key, value in entry.items():
            if key not in ("step", "epoch"):
                assert record[key] == pytest.approx(value, rel=1e-6), key

    every = [(s, r["status"], r["step"], Path(r["path"]).name) for s, r in tagged if r["type"] == "checkpoint"]
    assert every == [(0, "saved", 4, "checkpoint-4"), (1, "loaded", 4, "checkpoint-4"), (1, "saved", 8, "checkpoint-8"), (1, "saved", 10, "checkpoint-10")], every
    assert all(r["bytes"] > 0 for s, r in tagged if r["type"] == "checkpoint")
    assert all((out / f"checkpoint-{s}" / "flightlog_manifest.json").exists() for s in (4, 8, 10))

    continuity = [r for _, r in tagged if "continuity" in r]
    assert [r["continuity"] for r in continuity] == ["exact"], continuity
    events = [r for _, r in tagged if r["type"] == "event"]
    assert not [e for e in events if e.get("level") == "ERROR"], [e["message"] for e in events if e.get("level") == "ERROR"]
    messages = [e["message"] for e in events]
    assert f"Resuming from checkpoint '{out / 'checkpoint-4'}'" in messages
