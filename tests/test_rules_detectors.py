"""Every rule on a series that must trigger it and one that must not, warmup included."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from flightlog.rules.config import RulesConfig
from flightlog.rules.detectors import (AdapterStalled, CyclicLR, GradExplosion, GradVanishing, LossSpike, MemoryPressure,
                                       NonFinite, Oscillation, Plateau, Rising, SlowStep, zigzag_swings)
from flightlog.rules.engine import RulesEngine, WarmupTracker


def noisy(n: int, *, level: float = 2.0, sigma: float = 0.03, slope: float = -0.001, seed: int = 0, start: int = 1,
          **extra: Any) -> list[dict[str, Any]]:
    """A healthy run: slowly falling loss with Gaussian noise."""
    rng = random.Random(seed)
    return [{"type": "metrics", "step": start + i, "loss": level + slope * i + rng.gauss(0, sigma), **extra} for i in range(n)]


def run(detector: Any, records: list[dict[str, Any]], warmup: bool = False) -> list[Any]:
    found = []
    for r in records:
        found.extend(detector.update(r, warmup))
    return found


def engine_findings(records: list[dict[str, Any]], config: RulesConfig | None = None) -> list[Any]:
    engine = RulesEngine(config)
    out = []
    for r in records:
        out.extend(engine.evaluate(r))
    return out


class TestNonFinite:
    def test_nan_loss_is_critical(self) -> None:
        """A NaN loss (as the writer hands it: the protocol string) is a critical finding with an action."""
        found = run(NonFinite(), noisy(5) + [{"step": 6, "loss": "NaN"}])
        assert [(f.rule, f.severity, f.step) for f in found] == [("nonfinite", "critical", 6)]
        assert "max_grad_norm 1.0" in found[0].action

    def test_inf_grad_norm_and_finite_values(self) -> None:
        """Inf in grad_norm fires; finite values never do."""
        assert run(NonFinite(), noisy(50, grad_norm=1.0)) == []
        assert [f.key for f in run(NonFinite(), [{"step": 1, "grad_norm": math.inf}])] == ["nonfinite:grad_norm"]


class TestLossSpike:
    def test_spike_fires_once_and_clean_noise_does_not(self) -> None:
        """A +1.6 jump (the seeds' 1.82 -> 3.41) fires; 500 steps of noise do not."""
        clean = noisy(500, sigma=0.05)
        assert run(LossSpike(), clean) == []
        spiked = noisy(200, sigma=0.05)
        spiked[150]["loss"] += 1.6
        found = run(LossSpike(), spiked)
        assert [f.step for f in found] == [151]
        assert "max_grad_norm 1.0" in found[0].action and "empty lines" in found[0].action

    def test_noisy_run_needs_more_than_one(self) -> None:
        """Jumps > 1.0 that are ordinary for a very noisy loss (sigma 0.4) are not spikes."""
        assert run(LossSpike(), noisy(300, sigma=0.4, seed=3)) == []

    def test_ratio_to_early_maximum(self) -> None:
        """Megatron's test: a value >= 10x the maximum of the first values fires."""
        records = noisy(120, level=0.2, sigma=0.001, slope=0.0)
        records.append({"step": 121, "loss": 2.5})
        found = run(LossSpike(LossSpike.Config(sigmas=1e9, jump=1e9)), records)
        assert found and "x the maximum" in found[0].message


class TestWarmup:
    def warmup_then_stable(self, spike_at: int | None) -> list[dict[str, Any]]:
        """The seeds' case 1: loss jumping between 3.0 and 5.0 while lr rises, then a stable phase."""
        rng = random.Random(1)
        records = []
        for step in range(1, 101):
            lr = 2e-5 * step / 100
            records.append({"type": "metrics", "step": step, "loss": 4.0 + (1 if step % 2 else -1) * rng.uniform(0.5, 1.0),
                            "learning_rate": lr, "grad_norm": rng.uniform(4, 12), "stage": "warmup"})
        for step in range(101, 401):
            loss = 2.98 - 0.001 * (step - 100) + rng.gauss(0, 0.03)
            if step == spike_at:
                loss += 1.5
            records.append({"type": "metrics", "step": step, "loss": loss, "learning_rate": 2e-5, "grad_norm": rng.uniform(0.8, 1.2),
                            "stage": "stable"})
        return records

    def test_warmup_noise_does_not_alarm_but_says_so(self) -> None:
        """Oscillation and big gradients during warmup give info notes ('expected'), never warnings."""
        found = engine_findings(self.warmup_then_stable(None))
        assert found, "the warmup swings should at least be noted"
        assert {f.severity for f in found} == {"info"}
        assert all("expected during warmup" in f.message for f in found)

    def test_spike_right_after_warmup_alarms(self) -> None:
        """A spike 5 steps after warmup ends is judged on post-warmup noise, not the warmup swings."""
        found = [f for f in engine_findings(self.warmup_then_stable(105)) if f.severity != "info"]
        assert [(f.rule, f.step) for f in found] == [("loss_spike", 105)]

    def test_warmup_from_rising_lr_without_stage(self) -> None:
        """Without a stage field, a learning rate rising from the start is warmup; its end is the first non-rise."""
        tracker = WarmupTracker()
        flags = [tracker.update({"step": s, "learning_rate": min(s, 10) * 1e-5}) for s in range(1, 15)]
        assert flags[:10] == [True] * 10 and flags[10:] == [False] * 4
        assert WarmupTracker(warmup_steps=3).update({"step": 3}) is True
        assert WarmupTracker(warmup_steps=3).update({"step": 4}) is False


class TestPlateau:
    def test_constant_loss_fires(self) -> None:
        """The seeds' 2.1423 -> 2.1421 -> 2.1420: < 0.0005 change over 50 steps."""
        flat = [{"step": i, "loss": 2.1423 - 0.000005 * i} for i in range(1, 61)]
        found = run(Plateau(), flat)
        assert found and found[0].step == 50 and "lr" not in found[0].message
        assert "learning_rate" in found[0].action

    def test_learning_and_converged_losses_do_not(self) -> None:
        """A falling loss is learning; a loss near zero is converged, not stuck."""
        assert run(Plateau(), noisy(200, sigma=0.01)) == []
        assert run(Plateau(), [{"step": i, "loss": 1e-4} for i in range(1, 100)]) == []


class TestOscillation:
    def test_swings_fire(self) -> None:
        """The seeds' 1.2 -> 1.8 -> 1.3 -> 1.9 pattern (peak-valley > 0.5)."""
        records = noisy(100, sigma=0.02)
        for i, r in enumerate(records[60:80]):
            r["loss"] += 0.35 if i % 2 else -0.35
        found = run(Oscillation(), records)
        assert found and found[0].severity == "warning" and "learning_rate" in found[0].action

    def test_trend_and_single_spike_do_not(self) -> None:
        """A fast-falling loss is one move; a spike is two; neither oscillates."""
        falling = [{"step": i, "loss": 5.0 - 0.05 * i} for i in range(1, 80)]
        assert run(Oscillation(), falling) == []
        spiked = noisy(100, sigma=0.02)
        spiked[70]["loss"] += 2.0
        assert run(Oscillation(), spiked) == []

    def test_zigzag_counts(self) -> None:
        assert zigzag_swings([1.2, 1.8, 1.3, 1.9], 0.5)[0] == 3
        assert zigzag_swings([1.0, 1.1, 1.2, 1.3], 0.5)[0] == 0


class TestRising:
    def test_ten_consecutive_rises(self) -> None:
        """The seeds' Alertmanager example: 10 rises in a row."""
        records = noisy(60, sigma=0.01, seed=2) + [{"step": 61 + i, "loss": 2.0 + 0.01 * i} for i in range(12)]
        found = run(Rising(), records)
        assert found and "10 times in a row" in found[0].message

    def test_noisy_divergence_trend(self) -> None:
        """A rising trend through noise (never 10 rises in a row) fires by the t-test."""
        rng = random.Random(4)
        records = [{"step": i, "loss": 2.0 + 0.01 * i + rng.gauss(0, 0.05)} for i in range(1, 120)]
        found = run(Rising(), records)
        assert found and "trends upward" in found[0].message

    def test_flat_noise_does_not(self) -> None:
        assert run(Rising(), noisy(2000, sigma=0.05, slope=0.0, seed=5)) == []


class TestGradients:
    def test_explosion_against_history(self) -> None:
        """grad_norm 9 after norms around 1 fires; a model that always runs at 7 does not."""
        records = [{"step": i, "grad_norm": 1.0 + 0.05 * (i % 3)} for i in range(1, 40)] + [{"step": 40, "grad_norm": 9.0}]
        assert [f.step for f in run(GradExplosion(), records)] == [40]
        steady = [{"step": i, "grad_norm": 7.0 + 0.5 * (i % 2)} for i in range(1, 200)]
        assert run(GradExplosion(), steady) == []

    def test_vanishing_needs_patience(self) -> None:
        """< 0.01 for 10 records fires; one tiny value in a healthy run does not."""
        low = [{"step": i, "grad_norm": 0.005} for i in range(1, 12)]
        assert [f.step for f in run(GradVanishing(), low)] == [10, 11]
        blip = [{"step": i, "grad_norm": 0.005 if i == 5 else 1.0} for i in range(1, 30)]
        assert run(GradVanishing(), blip) == []

    def test_adapter_stalled_qlora_case(self) -> None:
        """The seeds' QLoRA case: adapter 1.2e-6 with a frozen backbone; the action says raise the rank."""
        stuck = [{"step": 1500 + i, "grad_norm_adapter": 1.2e-6, "grad_norm_backbone": 0.0} for i in range(12)]
        found = run(AdapterStalled(), stuck)
        assert found and "lora_rank 8 -> 32" in found[0].action
        healthy = [{"step": i, "grad_norm_adapter": 0.4, "grad_norm_backbone": 0.0} for i in range(50)]
        assert run(AdapterStalled(), healthy) == []


class TestSystem:
    def test_memory_above_95_percent(self) -> None:
        """23.8GB/24.0GB (the seeds' OOM example) fires; 14.2GB/24.0GB does not."""
        assert run(MemoryPressure(), [{"step": 1, "gpu_memory_mb": 23.8 * 1024, "gpu_memory_total_mb": 24.0 * 1024}])
        assert not run(MemoryPressure(), [{"step": 1, "gpu_memory_mb": 14.2 * 1024, "gpu_memory_total_mb": 24.0 * 1024}])

    def test_step_time_doubling(self) -> None:
        """Step time 1.82s -> 4s for 3 records fires and names data loading; one slow step (a save) does not."""
        base = [{"step": i, "step_time_s": 1.82} for i in range(1, 30)]
        slow = base + [{"step": 30 + i, "step_time_s": 4.0, "data_time_s": 2.5} for i in range(3)]
        found = run(SlowStep(), slow)
        assert [f.step for f in found] == [32] and "data loading" in found[0].message
        assert run(SlowStep(), base + [{"step": 30, "step_time_s": 30.0}] + base) == []

    def test_cyclic_schedule(self) -> None:
        """Loss peaks that line up with lr peaks fire; cosine decay with a falling loss does not."""
        rng = random.Random(6)
        cyclic = []
        for i in range(1, 601):
            lr = 1e-4 * (0.1 + 0.9 * abs(1 - 2 * ((i % 100) / 100)))
            cyclic.append({"step": i, "learning_rate": lr, "loss": 2.0 - 0.001 * i + 0.5 * lr / 1e-4 + rng.gauss(0, 0.03)})
        assert run(CyclicLR(), cyclic)
        cosine = [{"step": i, "learning_rate": 1e-4 * 0.5 * (1 + math.cos(math.pi * i / 600)), "loss": 3.0 - 0.002 * i + rng.gauss(0, 0.03)}
                  for i in range(1, 601)]
        assert run(CyclicLR(), cosine) == []


class TestEngine:
    def test_one_alert_per_problem_rearmed_after_recovery(self) -> None:
        """A memory problem lasting 50 records is one alert; after 20 clean records it can alert again."""
        high = {"gpu_memory_mb": 23500.0, "gpu_memory_total_mb": 24000.0}
        low = {"gpu_memory_mb": 12000.0, "gpu_memory_total_mb": 24000.0}
        records = ([{"step": i, **high} for i in range(1, 51)] + [{"step": i, **low} for i in range(51, 75)]
                   + [{"step": i, **high} for i in range(75, 80)])
        found = engine_findings(records)
        assert [(f.rule, f.step) for f in found] == [("memory_pressure", 1), ("memory_pressure", 75)]

    def test_disabled_rule(self) -> None:
        config = RulesConfig()
        config.detectors["memory_pressure"].enabled = False
        assert engine_findings([{"step": 1, "gpu_memory_mb": 99.0, "gpu_memory_total_mb": 100.0}], config) == []

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_clean_run_is_silent(self, seed: int) -> None:
        """A healthy 1500-step run with lr warmup, cosine decay and all seed fields raises nothing."""
        rng = random.Random(seed)
        records = []
        for step in range(1, 1501):
            lr = 1e-4 * min(1.0, step / 100) * (0.55 + 0.45 * math.cos(math.pi * max(0, step - 100) / 1400))
            records.append({"type": "metrics", "step": step, "loss": 1.0 + 2.5 * math.exp(-step / 400) + rng.gauss(0, 0.05),
                            "learning_rate": lr, "grad_norm": rng.lognormvariate(0, 0.2), "gpu_memory_mb": 14500.0 + rng.gauss(0, 100),
                            "gpu_memory_total_mb": 24576.0, "step_time_s": 1.8 * rng.lognormvariate(0, 0.05),
                            "grad_norm_adapter": 0.5, "grad_norm_backbone": 0.0})
        assert [f for f in engine_findings(records) if f.severity != "info"] == []

    def test_large_scale_loss_is_judged_on_its_scale(self) -> None:
        """A regression loss around 1000 (noise sigma 5) is silent from its first record on, while a
        real jump at that scale (1000 -> 1600) is still a spike."""
        records = noisy(300, level=1000.0, sigma=5.0, slope=-0.2, seed=8)
        assert [f for f in engine_findings(records) if f.severity != "info"] == []
        records[200]["loss"] += 600.0
        assert [(f.rule, f.step) for f in engine_findings(records) if f.severity != "info"] == [("loss_spike", 201)]
