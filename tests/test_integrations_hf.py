"""FlightlogCallback on a real HF Trainer: a tiny LLaMA built from a config, a peft LoRA adapter, CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import flightlog
from flightlog.integrations.hf import FlightlogCallback


def read(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / "train.jsonl").read_text().splitlines()]


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        # A learnable pattern: each sequence counts up from a random start.
        starts = torch.randint(0, 80, (n, 1), generator=g)
        self.ids = (starts + torch.arange(length)) % 100

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_lora_llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora)


def train(tmp_path: Path, callback: FlightlogCallback, **overrides: Any) -> Any:
    options = dict(
        output_dir=str(tmp_path / "out"), max_steps=30, per_device_train_batch_size=4, learning_rate=5e-3,
        warmup_steps=5, logging_steps=5, logging_first_step=True, eval_strategy="steps", eval_steps=10,
        save_strategy="steps", save_steps=15, max_grad_norm=1.0, report_to=[], use_cpu=True,
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )
    options.update(overrides)
    resume = options.pop("resume_from_checkpoint", None)
    args = transformers.TrainingArguments(**options)
    trainer = transformers.Trainer(
        model=tiny_lora_llama(), args=args, train_dataset=TokenDataset(256), eval_dataset=TokenDataset(16, seed=1),
        callbacks=[callback],
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.slow
def test_records_equal_log_history_and_adapter_norms(tmp_path: Path) -> None:
    """Every log_history entry is one metrics record with the same step, epoch and values;
    the frozen backbone reads grad_norm_backbone == 0 while the adapter's norm is the whole norm."""
    callback = FlightlogCallback(task_type="sft", dataset="counting", sinks=["jsonl"], install_signal_handlers=False)
    trainer = train(tmp_path, callback)
    history = trainer.state.log_history
    records = read(tmp_path / "out" / "logs")
    metrics = [r for r in records if r["type"] == "metrics"]
    assert len(metrics) == len(history) >= 10
    for entry, record in zip(history, metrics):
        assert record["step"] == entry["step"]
        assert record["epoch"] == entry["epoch"]
        for key, value in entry.items():
            if key not in ("step", "epoch"):
                assert record[key] == value, (entry["step"], key)

    train_records = [r for r in metrics if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 5, 10, 15, 20, 25, 30]
    for r in train_records:
        assert r["grad_norm_adapter"] > 0
        assert r["grad_norm_backbone"] == 0.0
        assert r["grad_norm_adapter"] == pytest.approx(r["grad_norm"], rel=1e-4)  # rescaled to the pre-clip norm
        assert r["step_time_s"] > 0 and 0 <= r["data_time_s"] < r["step_time_s"]
        assert r["throughput_samples_per_sec"] == pytest.approx(4 / r["step_time_s"])
        assert r["precision"] == "fp32"
        assert r["process_rss_mb"] > 0
    assert [r["stage"] for r in train_records] == ["warmup", "warmup"] + ["stable"] * 5

    eval_records = [r for r in metrics if "eval_loss" in r]
    assert [r["step"] for r in eval_records] == [10, 20, 30]
    assert all("grad_norm_adapter" not in r and "cpu_percent" not in r for r in eval_records)
    assert "train_runtime" in metrics[-1]

    start = next(r for r in records if r["type"] == "run_start")
    assert start["task_type"] == "sft" and start["dataset"] == "counting" and start["model_name"] == "llama"
    assert start["max_steps"] == 30
    config = start["config"]
    assert config["learning_rate"] == 5e-3 and config["per_device_train_batch_size"] == 4 and config["lr_scheduler_type"] == "linear"
    assert config["model"]["trainable_parameters"] < config["model"]["parameters"]
    assert config["model"]["peft_config"]["default"]["r"] == 4
    assert sorted(config["model"]["peft_config"]["default"]["target_modules"]) == ["q_proj", "v_proj"]
    assert config["trainer"]["warmup_steps"] == 5

    checkpoints = [r for r in records if r["type"] == "checkpoint"]
    assert [(r["step"], r["status"]) for r in checkpoints] == [(15, "saved"), (30, "saved")]
    assert all(Path(r["path"]).is_dir() and r["bytes"] > 0 and r["seconds"] >= 0 for r in checkpoints)
    messages = [r["message"] for r in records if r["type"] == "event"]
    assert any(m.startswith("Evaluation at step 10: eval_loss=") for m in messages)
    assert records[-1]["type"] == "run_end" and records[-1]["status"] == "finished"

    # trainer.evaluate() after train(): the finished run is reopened as a segment that only appends.
    trainer.evaluate()
    callback.run.finish()
    more = read(tmp_path / "out" / "logs")[len(records):]
    assert more[0]["type"] == "run_start" and more[0]["segment"] == 1 and more[0]["resumed_from_step"] is None
    assert more[0]["run_id"] == start["run_id"]
    assert [r["step"] for r in more if r["type"] == "metrics" and "eval_loss" in r] == [30]


@pytest.mark.slow
def test_resumed_training_continues_the_run(tmp_path: Path) -> None:
    """Training resumed from checkpoint-10 is segment 1 of the same run, resumed_from_step=10;
    the loader hides nothing it should not and every step appears once."""
    opts = dict(logging_steps=5, eval_strategy="no", save_strategy="steps", save_steps=10, logging_first_step=False)
    train(tmp_path, FlightlogCallback(sinks=["jsonl"], install_signal_handlers=False), max_steps=10, **opts)
    train(tmp_path, FlightlogCallback(sinks=["jsonl"], install_signal_handlers=False), max_steps=20,
          resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-10"), **opts)
    records = read(tmp_path / "out" / "logs")
    starts = [r for r in records if r["type"] == "run_start"]
    assert [(s["segment"], s["resumed_from_step"]) for s in starts] == [(0, None), (1, 10)]
    assert len({r["run_id"] for r in records}) == 1
    frame = flightlog.load(tmp_path / "out" / "logs")
    losses = frame[frame["loss"].notna()] if "loss" in frame else frame
    assert losses["step"].tolist() == [5, 10, 15, 20]


@pytest.mark.slow
def test_existing_run_and_no_collectors(tmp_path: Path) -> None:
    """A run the user opened stays open after training; collect=False records only the Trainer's values."""
    run = flightlog.init(output_dir=tmp_path / "mine", sinks=["jsonl"], install_signal_handlers=False)
    train(tmp_path, FlightlogCallback(run, collect=False), max_steps=6, logging_steps=3, eval_strategy="no", save_strategy="no", logging_first_step=False)
    assert not run.finished
    run.log({"after": 1.0}, step=7)
    run.finish()
    metrics = [r for r in read(run.log_dir) if r["type"] == "metrics"]
    assert [r["step"] for r in metrics] == [3, 6, 6, 7]
    assert set(metrics[0]) == {"type", "timestamp", "run_id", "step", "epoch", "loss", "grad_norm", "learning_rate"}
    assert not (tmp_path / "out" / "logs").exists()


def test_only_the_main_process_writes(tmp_path: Path) -> None:
    """On a rank that is not world process zero the callback creates no run and writes nothing."""
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    state = transformers.TrainerState(is_world_process_zero=False, max_steps=10)
    control = transformers.TrainerControl()
    callback = FlightlogCallback(sinks=["jsonl"])
    callback.on_train_begin(args, state, control, model=None)
    callback.on_log(args, state, control, logs={"loss": 1.0, "epoch": 0.1})
    callback.on_train_end(args, state, control)
    assert callback.run is None and not (tmp_path / "out").exists()


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="flightlog.Run"):
        FlightlogCallback("run")  # type: ignore[arg-type]


def test_swift_plugin_registers_with_both_ms_swift_generations(monkeypatch: pytest.MonkeyPatch) -> None:
    """ms-swift is not installable here: its two registries are stood in by modules holding
    the same objects (ms-swift 4: callbacks_map[name](args, trainer); ms-swift 3: extra_callbacks)."""
    import subprocess
    import sys
    import types

    from flightlog.integrations import swift_plugin

    v4 = types.ModuleType("swift.callbacks.mapping")
    v4.callbacks_map = {"early_stop": object}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "swift", types.ModuleType("swift"))
    monkeypatch.setitem(sys.modules, "swift.callbacks", types.ModuleType("swift.callbacks"))
    monkeypatch.setitem(sys.modules, "swift.callbacks.mapping", v4)
    assert swift_plugin.register(task_type="sft") == ["swift.callbacks callbacks_map['flightlog']"]
    callback = v4.callbacks_map["flightlog"]("training-args", "trainer")  # type: ignore[attr-defined]
    assert isinstance(callback, FlightlogCallback) and callback.task_type == "sft"

    monkeypatch.delitem(sys.modules, "swift.callbacks.mapping")
    monkeypatch.delitem(sys.modules, "swift.callbacks")
    v3 = types.ModuleType("swift.plugin")
    v3.extra_callbacks = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "swift.plugin", v3)
    assert swift_plugin.register() == ["swift.plugin.extra_callbacks"]
    assert swift_plugin.register() == ["swift.plugin.extra_callbacks"]
    assert [type(c) for c in v3.extra_callbacks] == [FlightlogCallback]  # type: ignore[attr-defined]

    out = subprocess.run([sys.executable, "-m", "flightlog.integrations.swift_plugin"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == swift_plugin.__file__

