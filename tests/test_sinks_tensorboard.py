"""The tensorboard sink, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import flightlog
from flightlog.protocol import decode

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install 'flightlog[tensorboard]')")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

QUIET = dict(console_stream="stderr", install_signal_handlers=False)


def f32(value: float) -> float:
    """What the event format's float32 ``simple_value`` holds for ``value``."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def accumulate(path: Path) -> EventAccumulator:
    ea = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    return ea


def records(log_dir: Path, kind: str) -> list[dict]:
    lines = (log_dir / "train.jsonl").read_bytes().splitlines()
    return [r for r in map(decode, lines) if r["type"] == kind]


def expected_tag(name: str) -> str:
    return "eval/" + name[5:] if name.startswith("eval_") else "train/" + name


class TestScalars:
    def test_every_scalar_reads_back(self, tmp_path: Path) -> None:
        """Each numeric field of each metrics record is a scalar with the same step and (float32) value."""
        run = flightlog.init(tmp_path, sinks=["jsonl", "tensorboard"], run_name="tb", **QUIET)
        for step in range(1, 41):
            metrics = {
                "loss": 3.0 / step + 0.001 * step,
                "learning_rate": 1e-4 * min(1.0, step / 10),
                "tokens": 512 * step,  # int
                "stage": "warmup" if step <= 10 else "stable",  # string: skipped
                "is_best": step == 40,  # bool: skipped
                "per_expert": [1, 2, 3],  # list: skipped
            }
            if step == 17:
                metrics["loss"] = float("nan")
            if step == 18:
                metrics["grad_norm"] = float("inf")
            if step % 10 == 0:
                metrics["eval_loss"] = 2.0 / step
                metrics["eval_accuracy"] = step / 50
            run.log(metrics, step=step, epoch=step / 20)
        run.finish()

        log_dir = tmp_path / "logs"
        ea = accumulate(log_dir / "tensorboard")
        wanted: dict[str, list[tuple[int, float]]] = {}
        for record in records(log_dir, "metrics"):
            for key, value in record.items():
                if key in ("type", "timestamp", "run_id", "step") or isinstance(value, (bool, str, list)):
                    continue
                wanted.setdefault(expected_tag(key), []).append((record["step"], float(value)))
        assert set(ea.Tags()["scalars"]) == set(wanted)
        assert {"train/loss", "train/epoch", "train/tokens", "eval/loss", "eval/accuracy", "train/grad_norm"} <= set(wanted)
        assert not any("stage" in tag or "is_best" in tag or "per_expert" in tag for tag in ea.Tags()["scalars"])
        total = 0
        for tag, points in wanted.items():
            got = [(e.step, e.value) for e in ea.Scalars(tag)]
            assert [s for s, _ in got] == [s for s, _ in points], tag
            for (step, value), (_, read) in zip(points, got):
                if math.isnan(value):
                    assert math.isnan(read), (tag, step)
                else:
                    assert read == f32(value), (tag, step, value, read)
            total += len(points)
        assert total == 40 * 4 + 4 * 2 + 1  # loss, learning_rate, tokens, epoch; 2 evals x 4; one grad_norm
        loss = dict((e.step, e.value) for e in ea.Scalars("train/loss"))
        assert math.isnan(loss[17])
        assert dict((e.step, e.value) for e in ea.Scalars("train/grad_norm")) == {18: math.inf}
        assert [e.step for e in ea.Scalars("eval/loss")] == [10, 20, 30, 40]

    def test_wall_time_is_the_record_time(self, tmp_path: Path) -> None:
        """Scalars carry the time the metric was logged, not the time the file was written."""
        run = flightlog.init(tmp_path, sinks=["jsonl", "tensorboard"], **QUIET)
        run.log({"loss": 1.0}, step=1)
        run.finish()
        stamp = records(tmp_path / "logs", "metrics")[0]["timestamp"]
        from flightlog.protocol import parse_timestamp

        (event,) = accumulate(tmp_path / "logs" / "tensorboard").Scalars("train/loss")
        assert event.wall_time == pytest.approx(parse_timestamp(stamp), abs=1e-3)

    def test_resumed_segment_hides_superseded_steps(self, tmp_path: Path) -> None:
        """A run resumed from step 3 shows steps 4.. from the new segment only, as flightlog.load does."""
        first = flightlog.init(tmp_path, sinks=["jsonl", "tensorboard"], **QUIET)
        for step in range(1, 7):
            first.log({"loss": float(step)}, step=step)
        first.finish("failed")
        second = flightlog.init(tmp_path, sinks=["jsonl", "tensorboard"], resumed_from_step=3, **QUIET)
        for step in range(4, 9):
            second.log({"loss": 100.0 + step}, step=step)
        second.finish()
        points = [(e.step, e.value) for e in accumulate(tmp_path / "logs" / "tensorboard").Scalars("train/loss")]
        assert points == [(1, 1.0), (2, 2.0), (3, 3.0)] + [(s, 100.0 + s) for s in range(4, 9)]


class TestRunStart:
    def test_config_as_text_and_hparams(self, tmp_path: Path) -> None:
        """run_start's config is readable as text and as an hparams session."""
        from tensorboard.plugins.hparams import metadata as hparams_metadata

        secret = "sk-abcdefghijklmnopqrstuvwx"
        config = {"learning_rate": 2e-4, "lora": {"r": 8, "alpha": 16}, "target_modules": ["q_proj", "v_proj"], "bf16": True, "note": None,
                  "openai_api_key": secret, "hub": {"url": f"https://user:{secret}@example.com"}}
        run = flightlog.init(tmp_path, sinks=["tensorboard"], run_name="cfg", task_type="sft", model_name="tiny", config=config, **QUIET)
        run.finish()
        ea = accumulate(tmp_path / "logs" / "tensorboard")
        (text,) = ea.Tensors("config")
        body = text.tensor_proto.string_val[0].decode()
        assert '"learning_rate": 0.0002' in body and '"r": 8' in body
        (about,) = ea.Tensors("run")
        assert "run_name: cfg" in about.tensor_proto.string_val[0].decode() and "task_type: sft" in about.tensor_proto.string_val[0].decode()
        content = ea.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data.content
        info = hparams_metadata.parse_session_start_info_plugin_data(content)
        hp = dict(info.hparams)
        assert hp["learning_rate"].number_value == 2e-4
        assert hp["lora.r"].number_value == 8
        assert hp["bf16"].bool_value is True
        assert hp["target_modules"].string_value == '["q_proj","v_proj"]'
        assert "note" not in hp
        # Secrets in the config were redacted before any sink saw them.
        assert secret not in body and hp["openai_api_key"].string_value == "[REDACTED]"
        assert secret not in hp["hub.url"].string_value
        for path in (tmp_path / "logs" / "tensorboard").iterdir():
            assert secret.encode() not in path.read_bytes()
        assert info.group_name == "cfg"  # the run name groups its sessions


class TestHistograms:
    @pytest.mark.slow
    def test_lora_weight_histograms_from_real_training(self, tmp_path: Path) -> None:
        """A peft LoRA model trained on the CPU: A/B histograms every N steps match the weights."""
        torch = pytest.importorskip("torch")
        peft = pytest.importorskip("peft", reason="the hf extra (peft) is not installed")
        from flightlog.sinks.tensorboard import log_lora_histograms

        torch.manual_seed(0)
        base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["0", "2"]))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        run = flightlog.init(tmp_path, sinks=["jsonl", "tensorboard"], histogram_interval=5, **QUIET)
        seen: dict[int, dict[str, torch.Tensor]] = {}
        for step in range(1, 16):
            x = torch.randn(8, 16)
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.log({"loss": loss.detach()}, step=step)
            if log_lora_histograms(run, model, step):
                seen[step] = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        run.finish()
        assert sorted(seen) == [5, 10, 15]

        ea = accumulate(tmp_path / "logs" / "tensorboard")
        tags = ea.Tags()["histograms"]
        assert len(tags) == 4 and all(t.startswith("lora/") for t in tags)
        assert any(t.endswith("lora_A.default") for t in tags) and any(t.endswith("lora_B.default") for t in tags)
        for name, weight in seen[5].items():
            tag = "lora/" + name.removeprefix("base_model.model.").removesuffix(".weight")
            events = ea.Histograms(tag)
            assert [e.step for e in events] == [5, 10, 15]
            for event in events:
                w = seen[event.step][name].float()
                h = event.histogram_value
                assert h.num == w.numel() and sum(h.bucket) == w.numel()
                assert h.min == pytest.approx(w.min().item()) and h.max == pytest.approx(w.max().item())
                assert h.sum == pytest.approx(w.sum().item(), abs=1e-5)
                assert h.sum_squares == pytest.approx((w * w).sum().item(), rel=1e-5)
                assert h.bucket_limit[-1] == pytest.approx(w.max().item(), abs=1e-6)
        # The compact summary is in the stream too, for every reader.
        (record,) = [r for r in records(tmp_path / "logs", "histograms") if r["step"] == 10]
        assert len(record["histograms"]) == 4

    def test_constant_tensor_and_bad_bins(self) -> None:
        """A zero-initialised LoRA B still gets a valid histogram; bad bins are refused by name."""
        torch = pytest.importorskip("torch")
        from flightlog.sinks.histograms import tensor_histogram

        h = tensor_histogram(torch.zeros(4, 8), bins=10)
        assert h["bucket"].sum().item() == 32 and h["bucket"][0].item() == 32
        assert h["min"].item() == 0.0 and h["max"].item() == 0.0
        with pytest.raises(ValueError, match="bins"):
            tensor_histogram(torch.ones(3), bins=0)

    def test_malformed_histogram_does_not_stop_scalars(self, tmp_path: Path) -> None:
        """A broken histograms record is reported as a sink failure; the scalars around it are written."""
        run = flightlog.init(tmp_path, sinks=["jsonl", "tensorboard"], **QUIET)
        run.log({"loss": 1.0}, step=1)
        run.record("histograms", step=1, histograms={"lora/x": {"min": 0.0}})
        run.log({"loss": 0.5}, step=2)
        run.finish()
        meta = flightlog.runfile.read_run_file(tmp_path / "logs")
        assert meta["sink_failures"] == {"tensorboard": 1}
        events = records(tmp_path / "logs", "event")
        assert any("sink 'tensorboard' failed" in e["message"] and "lora/x" in e["message"] for e in events)
        ea = accumulate(tmp_path / "logs" / "tensorboard")
        assert [e.value for e in ea.Scalars("train/loss")] == [1.0, 0.5]


def test_import_flightlog_stays_light() -> None:
    """Naming the optional sinks' modules imports none of their packages."""
    code = (
        "import sys, flightlog, flightlog.sinks.tensorboard, flightlog.sinks.prometheus, "
        "flightlog.sinks.wandb, flightlog.sinks.mlflow, flightlog.sinks.histograms\n"
        "heavy = [m for m in ('torch', 'tensorboard', 'prometheus_client', 'wandb', 'mlflow') if m in sys.modules]\n"
        "print(heavy)"
    )
    src = str(Path(flightlog.__file__).parent.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": src}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
