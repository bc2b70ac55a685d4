"""Built-in collectors and the plain-loop StepTimer, in real CPU training loops."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn

import flightlog
from flightlog.collect import Collectors, GradNorms, StepTimer, SystemStats, stage, warmup_steps_of
from flightlog.values import Derived, resolve_record, resolve_value, snapshot


def records(run: flightlog.Run, kind: str = "metrics") -> list[dict[str, Any]]:
    lines = (run.log_dir / "train.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


class LoRALinear(nn.Module):
    """A frozen base layer plus a trainable low-rank update, named like peft's."""

    def __init__(self, n_in: int, n_out: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(n_in, n_out)
        self.base.requires_grad_(False)
        self.lora_A = nn.Linear(n_in, rank, bias=False)
        self.lora_B = nn.Linear(rank, n_out, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x))


def make_run(tmp_path: Path, **kw: Any) -> flightlog.Run:
    return flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, **kw)


class TestGradNorms:
    def test_derived_values_resolve_once_and_rescale(self) -> None:
        """The writer resolves the shared vector once; a rescaled split keeps its proportions."""
        torch.manual_seed(2)
        model = nn.Sequential(LoRALinear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        model(torch.randn(4, 8)).pow(2).sum().backward()
        out = GradNorms(model.named_parameters()).compute()
        snapped = snapshot(out)  # what Run.log does on the training thread
        source = snapped["grad_norm"].source
        assert source.pending is not None and source.values is None  # copy started, nothing read yet
        record = dict(snapped)
        assert resolve_record(record, []) is False  # plain numbers afterwards
        total, adapter, backbone = record["grad_norm"], record["grad_norm_adapter"], record["grad_norm_backbone"]
        assert total == pytest.approx(math.hypot(adapter, backbone), rel=1e-12)
        scaled = out["grad_norm_adapter"].scaled_to(out["grad_norm"], 2 * total)
        assert float(scaled) == pytest.approx(2 * adapter, rel=1e-9)
        assert float(out["grad_norm_backbone"].scaled_to(out["grad_norm"], 0.0)) == 0.0
        assert resolve_value(snapshot({"x": scaled})["x"], "x") == pytest.approx(2 * adapter, rel=1e-9)
        # The same values derived with tensor ops (a distributed reduction on the device).
        assert float(out["grad_norm"].as_tensor()) == pytest.approx(total, rel=1e-6)
        assert float(out["grad_norm_backbone"].as_tensor()) == pytest.approx(backbone, rel=1e-6)
        assert float(scaled.as_tensor()) == pytest.approx(2 * adapter, rel=1e-6)
        assert float(out["grad_norm_adapter"].scaled_to(out["grad_norm"], 5.0).as_tensor()) == pytest.approx(5.0 * adapter / total, rel=1e-6)

    def test_split_matches_reference(self) -> None:
        """Total, adapter and backbone norms equal norms computed parameter by parameter."""
        torch.manual_seed(0)
        model = nn.Sequential(LoRALinear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        model(torch.randn(4, 8)).pow(2).sum().backward()
        out = GradNorms(model.named_parameters()).compute()
        adapter = [p.grad for n, p in model.named_parameters() if "lora_" in n]
        backbone = [p.grad for n, p in model.named_parameters() if "lora_" not in n and p.grad is not None]
        ref = lambda gs: math.sqrt(sum(float(g.pow(2).sum()) for g in gs))
        assert all(type(v) is Derived for v in out.values())  # numbers made on the writer thread
        assert len({id(v.source) for v in out.values()}) == 1  # from one vector of per-gradient norms
        assert float(out["grad_norm_adapter"]) == pytest.approx(ref(adapter), rel=1e-5)
        assert float(out["grad_norm_backbone"]) == pytest.approx(ref(backbone), rel=1e-5)
        assert float(out["grad_norm"]) == pytest.approx(ref(adapter + backbone), rel=1e-5)
        assert float(out["grad_norm"]) == pytest.approx(float(nn.utils.clip_grad_norm_(model.parameters(), math.inf)), rel=1e-5)

    def test_split_stays_right_when_the_set_of_gradients_changes(self) -> None:
        """The fused split caches its group mask per layout: repeated calls, a layer losing its
        gradient, and a layer gaining it back all give the parameter-by-parameter norms."""
        torch.manual_seed(1)
        model = nn.Sequential(LoRALinear(6, 6), nn.ReLU(), nn.Linear(6, 3), nn.Linear(3, 2))
        model[0].base.requires_grad_(True)
        norms = GradNorms(model.named_parameters())
        ref = lambda gs: math.sqrt(sum(float(g.pow(2).sum()) for g in gs))
        for frozen in (None, model[2], model[0].lora_A, None):
            for p in model.parameters():
                p.grad = None
            model.requires_grad_(True)
            if frozen is not None:
                frozen.requires_grad_(False)
            model(torch.randn(4, 6)).pow(2).sum().backward()
            out = norms.compute()
            named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
            adapter = [g for n, g in named if "lora_" in n]
            backbone = [g for n, g in named if "lora_" not in n]
            assert float(out["grad_norm_adapter"]) == pytest.approx(ref(adapter), rel=1e-5)
            assert float(out["grad_norm_backbone"]) == pytest.approx(ref(backbone), rel=1e-5)
            assert float(out["grad_norm"]) == pytest.approx(ref(adapter + backbone), rel=1e-5)

    def test_frozen_backbone_reads_zero_and_no_adapter_no_split(self) -> None:
        model = LoRALinear(4, 4)
        model(torch.randn(2, 4)).sum().backward()
        out = GradNorms(model.named_parameters()).compute()
        assert float(out["grad_norm_backbone"]) == 0.0 and float(out["grad_norm_adapter"]) > 0
        plain = nn.Linear(3, 3)
        plain(torch.randn(2, 3)).sum().backward()
        assert set(GradNorms(plain.named_parameters()).compute()) == {"grad_norm"}
        assert GradNorms(nn.Linear(2, 2).named_parameters()).compute() == {}

    def test_a_chunk_of_records_reads_its_norms_together(self) -> None:
        """The writer reads many records' CPU norm vectors with one stack: the same numbers
        as one .item() each, a vector met twice read once, a lone vector left alone."""
        from flightlog.values import resolve_together

        torch.manual_seed(4)
        model = nn.Sequential(LoRALinear(6, 6), nn.ReLU(), nn.Linear(6, 2))
        norms = GradNorms(model.named_parameters())
        vectors = []
        for frozen in (False, True, False):
            model.zero_grad(set_to_none=True)
            model[2].requires_grad_(not frozen)
            model(torch.randn(3, 6)).pow(2).sum().backward()
            vectors.append(norms.capture()[0])
        expected = [[t.item() for t in v.pending] for v in vectors]
        assert len(expected[1]) == len(expected[0]) - 2  # the frozen layer's two gradients are absent
        resolve_together([vectors[0], vectors[1], vectors[0], vectors[2]])
        assert [v.values for v in vectors] == expected
        lone = norms.capture()[0]
        resolve_together([lone, vectors[0]])  # one vector left to read: nothing gained, nothing done
        assert lone.values is None and lone.resolve() == [t.item() for t in lone.pending]

    def test_bad_patterns(self) -> None:
        with pytest.raises(ValueError, match="adapter_patterns"):
            GradNorms(nn.Linear(2, 2).named_parameters(), adapter_patterns="lora_")
        with pytest.raises(ValueError, match="without parameters"):
            GradNorms(nn.ReLU().named_parameters())


class TestSchedule:
    def test_warmup_steps_of_schedulers(self) -> None:
        opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        assert warmup_steps_of(torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=7)) == 7
        assert warmup_steps_of(torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=7)) is None
        seq = torch.optim.lr_scheduler.SequentialLR(
            opt,
            [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5), torch.optim.lr_scheduler.CosineAnnealingLR(opt, 20)],
            milestones=[5],
        )
        assert warmup_steps_of(seq) == 5
        from transformers import get_cosine_schedule_with_warmup

        assert warmup_steps_of(get_cosine_schedule_with_warmup(opt, 12, 100)) == 12
        assert warmup_steps_of(torch.optim.lr_scheduler.StepLR(opt, 3)) is None
        assert [stage(s, 2) for s in (1, 2, 3)] == ["warmup", "warmup", "stable"]
        assert stage(5, None) is None


class TestStepTimer:
    def test_loop_records_timing_lr_stage_and_grad_norms(self, tmp_path: Path) -> None:
        """Every 5th step a record with timing averages, lr, stage, and grad norms taken
        before the optimizer step even though the loop zeroes gradients right after it;
        the optimizer carries flightlog's pre-step hook on those steps only."""
        torch.manual_seed(0)
        model = nn.Sequential(LoRALinear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        model[2].requires_grad_(False)  # the whole backbone is frozen, as in LoRA fine-tuning
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
        run = make_run(tmp_path, logging_steps=5)
        timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, scheduler=sched), batch_size=4, tokens_per_step=32)

        def loader():
            for _ in range(20):
                time.sleep(0.002)
                yield torch.randn(4, 8)

        expected: dict[int, float] = {}
        lrs: dict[int, float] = {}
        hooks: list[int] = []
        for x in timer.data(loader()):
            with timer.step() as step:
                loss = model(x).pow(2).mean()
                loss.backward()
                if timer.next_is_logged:
                    expected[timer.step_count + 1] = float(nn.utils.clip_grad_norm_(model.parameters(), math.inf))
                lrs[timer.step_count + 1] = opt.param_groups[0]["lr"]
                hooks.append(len(opt._optimizer_step_pre_hooks))
                opt.step()
                opt.zero_grad(set_to_none=True)
                sched.step()
                step.log(loss=loss.detach())
        run.finish()
        assert hooks == [1 if (i + 1) % 5 == 0 else 0 for i in range(20)] and not opt._optimizer_step_pre_hooks
        recs = records(run)
        assert [r["step"] for r in recs] == [5, 10, 15, 20]
        for r in recs:
            assert r["grad_norm"] == pytest.approx(expected[r["step"]], rel=1e-5)
            assert r["grad_norm_backbone"] == 0.0 and r["grad_norm_adapter"] > 0
            assert r["data_time_s"] >= 0.0015 and r["step_time_s"] > r["data_time_s"]
            assert r["throughput_samples_per_sec"] == pytest.approx(4 / r["step_time_s"])
            assert r["throughput_tokens_per_sec"] == pytest.approx(32 / r["step_time_s"])
            assert r["precision"] == "fp32"
            assert isinstance(r["loss"], float)
            assert "gpu_memory_mb" not in r  # no CUDA here: skipped cleanly
            assert r["cpu_percent"] >= 0 and r["process_rss_mb"] > 0 and 0 <= r["disk_used_percent"] <= 100
        # lr recorded after the scheduler stepped, as the optimizer holds it then.
        assert recs[0]["learning_rate"] == pytest.approx(lrs[6])
        assert [r["stage"] for r in recs] == ["warmup", "warmup", "stable", "stable"]

    def test_waiting_and_failed_steps(self, tmp_path: Path) -> None:
        """waiting() counts as data time; a step that raises is not counted or logged."""
        run = make_run(tmp_path, logging_steps=2)
        timer = StepTimer(run)
        with pytest.raises(RuntimeError):
            with timer.step() as step:
                step.log(loss=1.0)
                raise RuntimeError("boom")
        for i in range(4):
            with timer.waiting():
                time.sleep(0.003)
            with timer.step() as step:
                step.log(loss=float(i))
        run.finish()
        recs = records(run)
        assert [(r["step"], r["loss"]) for r in recs] == [(2, 1.0), (4, 3.0)]
        assert all(r["data_time_s"] >= 0.0025 for r in recs)
        assert "throughput_samples_per_sec" not in recs[0]

    def test_throughput_counts_each_steps_own_sizes(self, tmp_path: Path) -> None:
        """Throughputs are the window's samples and tokens over its time: the per-step
        defaults, or what a step names itself (tokens may be a tensor); a failed step's
        sizes count nowhere; the other keyword metrics sit beside the loss."""
        run = make_run(tmp_path, logging_steps=4)
        timer = StepTimer(run, batch_size=8, tokens_per_step=100)
        sizes = [{}, {"samples": 2}, {"tokens": torch.tensor(40)}, {"samples": 1, "tokens": 10}, {}, {}, {}, {"samples": 3}]
        for i, size in enumerate(sizes):
            if i == 5:
                with pytest.raises(RuntimeError):
                    with timer.step(samples=1000, tokens=1000):
                        raise RuntimeError("boom")
            with timer.step(**size) as step:
                time.sleep(0.002)
                step.log(loss=float(i), accuracy=0.5)
        run.finish()
        recs = records(run)
        assert [(r["step"], r["loss"], r["accuracy"]) for r in recs] == [(4, 3.0, 0.5), (8, 7.0, 0.5)]
        window_s = [r["step_time_s"] * 4 for r in recs]
        assert recs[0]["throughput_samples_per_sec"] == pytest.approx((8 + 2 + 8 + 1) / window_s[0])
        assert recs[0]["throughput_tokens_per_sec"] == pytest.approx((100 + 100 + 40 + 10) / window_s[0])
        assert recs[1]["throughput_samples_per_sec"] == pytest.approx((8 + 8 + 8 + 3) / window_s[1])
        assert recs[1]["throughput_tokens_per_sec"] == pytest.approx(400 / window_s[1])
        assert all(0.002 <= r["step_time_s"] < 0.5 for r in recs)

    def test_grad_scaler_scale_is_recorded(self, tmp_path: Path) -> None:
        """An enabled GradScaler marks the run fp16 and its scale is logged without get_scale();
        a step it skips (inf gradients: the optimizer's pre-step hook never runs) leaves no
        hook behind, and the next step's norm is taken by the hook again."""
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        run = make_run(tmp_path)
        timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, scaler=scaler, system=False))
        for i in range(4):
            with timer.step():
                x = torch.full((2, 4), math.inf) if i == 2 else torch.randn(2, 4)
                scaler.scale(model(x).sum()).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        run.finish()
        recs = records(run)
        assert [r["grad_scaler_scale"] for r in recs] == [1024.0, 1024.0, 512.0, 512.0]  # (read after update(): halved by the skip)
        assert recs[0]["precision"] == "fp16" and "cpu_percent" not in recs[0]
        assert [type(r.get("grad_norm")) for r in recs] == [float, float, type(None), float]  # (the loop zeroed the skipped step's gradients)
        assert not opt._optimizer_step_pre_hooks

    def test_records_built_on_the_writer_equal_those_built_in_the_loop(self, tmp_path: Path) -> None:
        """A plain run's StepTimer records are put together on the writer thread; a run with
        an on_log hook gets them whole on the training thread. Both read the same: same
        keys in the same order, same values but for the measured times."""

        def train(run: flightlog.Run) -> list[dict[str, Any]]:
            torch.manual_seed(3)
            model = nn.Sequential(LoRALinear(8, 16), nn.ReLU(), nn.Linear(16, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=6)
            timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, scheduler=sched, system=False), batch_size=4, tokens_per_step=32, start_step=2)
            for _ in range(10):
                with timer.step() as step:
                    loss = model(torch.randn(4, 8)).pow(2).mean()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    sched.step()
                    step.log(loss=loss, epoch=timer.step_count / 4)
            run.finish()
            return records(run)

        seen: list[dict[str, Any]] = []
        built_here = make_run(tmp_path / "hook", logging_steps=3)
        built_here.on_log(lambda metrics, step: seen.append(dict(metrics)))
        on_writer, in_loop = train(make_run(tmp_path / "plain", logging_steps=3)), train(built_here)
        assert [r["step"] for r in on_writer] == [3, 6, 9, 12]  # start_step=2: steps 3..12
        assert [list(r) for r in on_writer] == [list(r) for r in in_loop]
        measured = {"timestamp", "step_time_s", "data_time_s", "throughput_samples_per_sec", "throughput_tokens_per_sec"}
        for a, b in zip(on_writer, in_loop):
            assert {k: v for k, v in a.items() if k not in measured | {"run_id"}} == {k: v for k, v in b.items() if k not in measured | {"run_id"}}
            assert a["grad_norm_adapter"] > 0 and a["stage"] in ("warmup", "stable") and a["precision"] == "fp32"
        assert [sorted(m) for m in seen] == [sorted(k for k in r if k not in ("type", "timestamp", "run_id", "step", "epoch")) for r in in_loop]

    def test_step_count_can_be_set(self, tmp_path: Path) -> None:
        """Setting step_count (a resumed loop) moves the next logging step with it."""
        run = make_run(tmp_path, logging_steps=5)
        timer = StepTimer(run)
        timer.step_count = 12
        assert not timer.next_is_logged
        for i in range(8):
            assert timer.next_is_logged is ((timer.step_count + 1) % 5 == 0)
            with timer.step() as step:
                time.sleep(0.01)
                step.log(loss=float(i))
        run.finish()
        recs = records(run)
        assert [(r["step"], r["loss"]) for r in recs] == [(15, 2.0), (20, 7.0)]
        assert 0.009 <= recs[0]["step_time_s"] < 0.5  # averaged over the 3 steps run, not 15
        with pytest.raises(ValueError, match="step_count"):
            timer.step_count = -1

    def test_a_record_that_cannot_be_built_keeps_the_logged_metrics(self, tmp_path: Path) -> None:
        """A builder failing on the writer thread costs the fields it adds, never the loop's
        own metrics or the other records; the failure is reported."""

        def broken(args: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
            out = []
            for metrics, fail in args:
                if fail:
                    raise ValueError("no window")
                out.append({**metrics, "extra": 1.0})
            return out

        run = make_run(tmp_path)
        run._log_built(broken, ({"loss": torch.tensor(0.5)}, False), 1, None)
        run._log_built(broken, ({"loss": 0.25}, True), 2, None)
        run._log_built(broken, ({"loss": 0.125}, False), 3, None)
        run.finish()
        assert [{k: r[k] for k in r if k in ("step", "loss", "extra")} for r in records(run)] == [
            {"step": 1, "loss": 0.5, "extra": 1.0}, {"step": 2, "loss": 0.25}, {"step": 3, "loss": 0.125, "extra": 1.0},
        ]
        assert any("could not put together a metrics record (ValueError: no window)" in e["message"] for e in records(run, "event"))

    def test_bad_arguments_are_named(self, tmp_path: Path) -> None:
        run = make_run(tmp_path)
        with pytest.raises(ValueError, match="logging_steps"):
            StepTimer(run, logging_steps=0)
        thinned = make_run(tmp_path / "thinned", logging_steps=2)
        with pytest.raises(ValueError, match="not a multiple of the run's logging_steps=2"):
            StepTimer(thinned, logging_steps=3)
        thinned.finish()
        with pytest.raises(ValueError, match="batch_size"):
            StepTimer(run, batch_size=2.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="warmup_steps"):
            Collectors(warmup_steps=-1)
        with pytest.raises(ValueError, match="memory_summary_steps"):
            Collectors(memory_summary_steps=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="optimizer"):
            Collectors(optimizer=object())
        with pytest.raises(ValueError, match="precision"):
            Collectors(precision="int4")
        run.finish()


def test_system_stats_leave_eval_records_alone(tmp_path: Path) -> None:
    stats = SystemStats(tmp_path, nvml=True)
    train = stats({"type": "metrics", "loss": 1.0})
    assert {"cpu_percent", "ram_used_mb", "ram_percent", "process_rss_mb", "disk_used_percent"} <= set(train)
    assert stats({"type": "metrics", "eval_loss": 1.0}) == {"type": "metrics", "eval_loss": 1.0}
    assert stats({"type": "event", "message": "x"}) == {"type": "event", "message": "x"}


def test_collect_package_does_not_import_torch() -> None:
    code = "import flightlog, flightlog.collect, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_collectors_never_sync_on_cuda(tmp_path: Path) -> None:
    """StepTimer with every collector on a CUDA LoRA-like model under sync_debug_mode('error'):
    no host-device sync on the training thread; GPU memory, grad norms and the memory summary land."""
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(256, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()
    model[2].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=20)
    x = torch.randn(64, 256, device="cuda")
    run = make_run(tmp_path, logging_steps=10)
    timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, scheduler=sched, memory_summary_steps=20), batch_size=64)

    def step() -> None:
        with timer.step() as s:
            loss = model(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.log(loss=loss.detach())

    for _ in range(10):  # warm-up outside the check: CUDA context, allocator, kernels
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    run.finish()
    recs = records(run)
    assert [r["step"] for r in recs] == [10, 20, 30, 40, 50, 60]
    for r in recs:
        assert r["gpu_memory_mb"] > 0 and r["gpu_memory_peak_mb"] >= r["gpu_memory_mb"] and r["gpu_memory_total_mb"] > 1000
        assert r["grad_norm_adapter"] > 0 and r["grad_norm_backbone"] == 0.0
        assert r["grad_norm"] == pytest.approx(r["grad_norm_adapter"], rel=1e-5)
    summaries = [e for e in records(run, "event") if e.get("kind") == "memory_summary"]
    assert [e["step"] for e in summaries] == [20, 40, 60] and "PyTorch CUDA memory summary" in summaries[0]["message"]


def test_system_stats_sampled_at_most_every_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records between samples get the latest sample; a record's own value wins."""
    stats = SystemStats(tmp_path, nvml=False, min_interval_s=5.0)
    reads = []
    real_read = stats.read
    monkeypatch.setattr(stats, "read", lambda: reads.append(1) or real_read())
    clock = [100.0]
    monkeypatch.setattr("flightlog.collect.system.time.monotonic", lambda: clock[0])
    first = stats({"type": "metrics", "loss": 1.0})
    clock[0] += 4.9
    second = stats({"type": "metrics", "loss": 0.9, "cpu_percent": -1.0})
    assert len(reads) == 1
    assert second["cpu_percent"] == -1.0 and second["ram_used_mb"] == first["ram_used_mb"]
    clock[0] += 0.2
    stats({"type": "metrics", "loss": 0.8})
    assert len(reads) == 2
    with pytest.raises(ValueError, match="system_interval_s"):
        Collectors(system_interval_s=-1)
