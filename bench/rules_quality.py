"""Quality of the diagnosis rules on labelled synthetic runs, against fixed thresholds.

Generates runs (clean, warmup noise, and one injected fault each: spike, divergence,
plateau, oscillation, vanishing gradients, memory ramp to OOM, stall, slow I/O, cyclic
lr schedule, stalled LoRA adapter) with random parameters (length, loss curve, noise
level and autocorrelation, warmup length, with/without a ``stage`` field, grad-norm
scale, memory, step time, checkpoint pauses), then replays each run through

* flightlog's rules (``RulesEngine`` + ``StallWatch``, default config), and
* a fixed-threshold baseline: the seeds' numbers applied literally (jump > 1.0,
  peak-valley > 0.5 in 20 records, 10 rises, grad_norm > 5 / < 0.01, memory > 95%,
  step time > 2x the first steps', no step for 600 s), no warmup awareness,

both behind the same one-alert-per-problem rate limiter, and prints recall per fault,
precision per rule, false alerts per 10,000 clean steps and detection delay.

    PYTHONPATH=src python bench/rules_quality.py --runs 264 --seed 0
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from flightlog.rules.config import RulesConfig
from flightlog.rules.detectors import Finding
from flightlog.rules.engine import RateLimiter, RulesEngine
from flightlog.rules.stall import StallWatch

KINDS = ("clean", "warmup_noise", "spike", "divergence", "plateau", "oscillation", "vanishing", "memory_oom",
         "stall", "slow_io", "cyclic_lr", "adapter_stalled")
ACCEPT: dict[str, set[str]] = {
    "spike": {"loss_spike", "grad_explosion"},
    "divergence": {"loss_rising", "loss_spike", "nonfinite", "grad_explosion", "loss_oscillation"},
    "plateau": {"loss_plateau", "grad_vanishing"},
    "oscillation": {"loss_oscillation", "loss_spike"},
    "vanishing": {"grad_vanishing", "loss_plateau"},
    "memory_oom": {"memory_pressure"},
    "stall": {"stall"},
    "slow_io": {"slow_step"},
    "cyclic_lr": {"cyclic_lr", "loss_rising", "loss_oscillation"},
    "adapter_stalled": {"adapter_stalled", "grad_vanishing"},
}
PRIMARY = {"spike": "loss_spike", "divergence": "loss_rising", "plateau": "loss_plateau", "oscillation": "loss_oscillation",
           "vanishing": "grad_vanishing", "memory_oom": "memory_pressure", "stall": "stall", "slow_io": "slow_step",
           "cyclic_lr": "cyclic_lr", "adapter_stalled": "adapter_stalled"}


@dataclass
class Synth:
    kind: str
    records: list[dict[str, Any]]
    times: list[float]
    onset: int | None = None
    hang: float = 0.0
    """Seconds the process hangs after the last record before it is killed (stall at the end)."""
    params: dict[str, Any] = field(default_factory=dict)


def generate(kind: str, rng: random.Random) -> Synth:
    n = rng.randint(400, 1500)
    warm = 0 if (kind != "warmup_noise" and rng.random() < 0.3) else rng.randint(30, max(31, n // 8))
    stage_field = rng.random() < 0.5
    peak = 10 ** rng.uniform(-5, -3.3)
    l0 = rng.uniform(2.0, 5.0)
    linf = rng.uniform(0.3, min(1.8, l0 - 0.3))
    tau = rng.uniform(n / 8, n / 2)
    sigma = rng.uniform(0.01, 0.12)
    phi = rng.uniform(0.0, 0.3)
    g0 = rng.uniform(0.3, 2.0) if rng.random() < 0.8 else rng.uniform(5.0, 10.0)
    total = rng.choice([24576.0, 40960.0, 81920.0])
    mem_frac = rng.uniform(0.4, 0.88)
    step_time = rng.uniform(0.2, 3.0)
    save_every = rng.choice([100, 200, 500])
    save_pause = rng.uniform(2.0, 60.0)
    lora = rng.random() < 0.5 or kind == "adapter_stalled"
    cycle = rng.randint(60, 200)
    onset = None if kind in ("clean", "warmup_noise") else rng.randint(warm + 120, max(warm + 121, n - 130))
    if kind == "cyclic_lr":
        onset = warm + cycle // 2  # the lr starts rising again here
        n = max(n, warm + 5 * cycle)

    records: list[dict[str, Any]] = []
    times: list[float] = []
    t = 0.0
    noise = 0.0
    hang = 0.0
    amp, period = rng.uniform(max(0.35, 4 * sigma), 0.8), rng.choice([2, 3, 4, 6])
    spike_h = rng.uniform(max(1.2, 10 * sigma), 3.0)
    spike_grad = rng.random() < 0.5
    div_a = rng.uniform(0.3, 2.0)
    div_nan = rng.random() < 0.5
    plateau_sd = rng.uniform(0.0, 5e-5)
    vanish_to = 10 ** rng.uniform(-4, math.log10(5e-3))
    ramp = rng.randint(50, 300)
    if kind == "memory_oom" and onset is not None:
        n = max(n, onset + ramp + 2)
    oom_at = rng.uniform(0.97, 1.0)
    gap = rng.uniform(180.0, 1800.0)
    hang_at_end = rng.random() < 0.5
    slow_factor = rng.uniform(2.5, 4.0)
    cyc_k = rng.uniform(0.3, 0.8)
    level_at_onset = None
    for i in range(n):
        step = i + 1
        # learning rate: linear warmup, then cosine decay (or triangle cycles)
        if step <= warm:
            lr = peak * step / warm
        elif kind == "cyclic_lr":
            phase = ((step - warm) % cycle) / cycle
            lr = peak * (0.1 + 0.9 * abs(1 - 2 * phase))
        else:
            lr = peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, n - warm))))
        noise = phi * noise + rng.gauss(0.0, sigma)
        loss = linf + (l0 - linf) * math.exp(-step / tau) + noise
        g = g0 * math.exp(rng.gauss(0.0, 0.15)) * (1.0 - 0.3 * step / n)
        st = step_time * math.exp(rng.gauss(0.0, 0.05))
        mem = total * min(0.93, mem_frac + rng.gauss(0.0, 0.01))
        if step % save_every == 0:
            st += save_pause
        if step <= warm:
            loss += rng.gauss(0.0, sigma * 0.5)
            if kind == "warmup_noise":
                loss += (1 if i % 2 else -1) * rng.uniform(0.5, 1.0)
                g *= rng.uniform(2.0, 6.0)
        adapter = g
        if onset is not None and i >= onset:
            k = i - onset
            if level_at_onset is None:
                level_at_onset = loss - noise
            if kind == "spike":
                loss += spike_h if k == 0 else (spike_h * 0.3 if k == 1 else 0.0)
                if k == 0 and spike_grad:
                    g *= rng.uniform(4.0, 20.0)
            elif kind == "divergence":
                loss += div_a * (k / 100) ** 2
                g *= 1 + k / 50
                if div_nan and k >= 150:
                    loss = float("nan")
            elif kind == "plateau":
                loss = level_at_onset + rng.gauss(0.0, plateau_sd)
            elif kind == "oscillation":
                loss += amp * (1 if (k // (period // 2 or 1)) % 2 else -1)
            elif kind == "vanishing":
                loss = level_at_onset + noise
                g = max(vanish_to, g * math.exp(-k / 5))
            elif kind == "memory_oom":
                mem = total * min(oom_at, mem_frac + (oom_at - mem_frac) * k / ramp)
            elif kind == "stall" and k == 0:
                if hang_at_end:
                    hang = gap
                    break
                t += gap
            elif kind == "slow_io":
                st *= slow_factor
            elif kind == "cyclic_lr":
                pass
            elif kind == "adapter_stalled":
                adapter = 1e-6 * math.exp(rng.gauss(0.0, 0.3))
                g = adapter
        if kind == "cyclic_lr" and step > warm:
            loss += cyc_k * lr / peak
        t += st
        rec: dict[str, Any] = {"type": "metrics", "step": step, "loss": max(0.01, loss) if loss == loss else loss,
                               "learning_rate": lr, "grad_norm": g, "gpu_memory_mb": mem, "gpu_memory_total_mb": total,
                               "step_time_s": st}
        if lora:
            rec["grad_norm_adapter"] = adapter
            rec["grad_norm_backbone"] = 0.0
        if stage_field:
            rec["stage"] = "warmup" if step <= warm else "stable"
        records.append(rec)
        times.append(t)
        if kind == "memory_oom" and onset is not None and i >= onset + ramp:
            break  # CUDA out of memory: the run dies
        if kind == "divergence" and div_nan and onset is not None and i >= onset + 155:
            break
        if kind == "slow_io" and onset is not None and i >= onset + 100:
            break
    return Synth(kind, records, times, onset, hang, {"warmup": warm, "stage_field": stage_field, "sigma": sigma, "gap": gap})


# --------------------------------------------------------------------------- baseline
class FixedThresholds:
    """The seeds' numbers, applied literally to each record (no warmup, no noise model)."""

    def __init__(self) -> None:
        self.prev: float | None = None
        self.window: deque[float] = deque(maxlen=20)
        self.flat: deque[float] = deque(maxlen=50)
        self.rises = 0
        self.first_times: list[float] = []

    def update(self, r: dict[str, Any]) -> list[Finding]:
        out: list[str] = []
        loss, g = r.get("loss"), r.get("grad_norm")
        if loss is not None and not math.isfinite(loss) or g is not None and not math.isfinite(g):
            out.append("nonfinite")
        if loss is not None and math.isfinite(loss):
            if self.prev is not None and loss - self.prev > 1.0:
                out.append("loss_spike")
            self.rises = self.rises + 1 if self.prev is not None and loss > self.prev else 0
            if self.rises >= 10:
                out.append("loss_rising")
            self.window.append(loss)
            self.flat.append(loss)
            if max(self.window) - min(self.window) > 0.5:
                out.append("loss_oscillation")
            if len(self.flat) == 50 and max(self.flat) - min(self.flat) < 0.0005:
                out.append("loss_plateau")
            self.prev = loss
        if g is not None and math.isfinite(g):
            if g > 5.0:
                out.append("grad_explosion")
            if g < 0.01:
                out.append("grad_vanishing")
        a = r.get("grad_norm_adapter")
        if a is not None and a < 1e-4 and r.get("grad_norm_backbone", 0.0) == 0.0:
            out.append("adapter_stalled")
        if r["gpu_memory_mb"] / r["gpu_memory_total_mb"] > 0.95:
            out.append("memory_pressure")
        st = r["step_time_s"]
        if len(self.first_times) < 20:
            self.first_times.append(st)
        elif st > 2 * median(self.first_times):
            out.append("slow_step")
        return [Finding(rule, "warning", rule, r["step"]) for rule in out]


def replay(synth: Synth, baseline: bool) -> list[tuple[int, str]]:
    """(record index, rule) of every alert the method raises on the run."""
    alerts: list[tuple[int, str]] = []
    if baseline:
        fixed, limiter = FixedThresholds(), RateLimiter(RulesConfig().rearm_after)
        last_t: float | None = None
        for i, (r, t) in enumerate(zip(synth.records, synth.times)):
            if last_t is not None and t - last_t > 600.0:
                alerts.append((i, "stall"))
                synth.params.setdefault("stall_after_baseline", 600.0)
            last_t = t
            alerts += [(i, f.rule) for f in limiter.admit(fixed.update(r), i + 1)]
        if synth.hang > 600.0:
            alerts.append((len(synth.records), "stall"))
            synth.params.setdefault("stall_after_baseline", 600.0)
        return alerts
    config = RulesConfig()
    engine, watch = RulesEngine(config), StallWatch(config.stall)
    for i, (r, t) in enumerate(zip(synth.records, synth.times)):
        limit = watch.limit()
        if watch.check(t - 1e-6) is not None:
            alerts.append((i, "stall"))
            synth.params.setdefault("stall_after", limit)  # seconds of silence before the timer fires
        watch.observe(r["step"], t)
        alerts += [(i, f.rule) for f in engine.evaluate(r) if f.severity != "info"]
    limit = watch.limit()
    if synth.hang and synth.times and watch.check(synth.times[-1] + synth.hang) is not None:
        alerts.append((len(synth.records), "stall"))
        synth.params.setdefault("stall_after", limit)
    return alerts


def score(runs: list[Synth], baseline: bool) -> dict[str, Any]:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    detected: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    delays: dict[str, list[int]] = defaultdict(list)
    clean_steps = clean_false = 0
    for synth in runs:
        alerts = replay(synth, baseline)
        onset = synth.onset if synth.onset is not None else len(synth.records) + 1
        accept = ACCEPT.get(synth.kind, set())
        clean_steps += min(onset, len(synth.records))
        first: int | None = None
        for i, rule in alerts:
            if i >= onset and rule in accept:
                tp[rule] += 1
                first = i if first is None else first
            else:
                fp[rule] += 1
                if i < onset:
                    clean_false += 1
        if synth.kind in ACCEPT:
            faults[synth.kind] += 1
            if first is not None:
                detected[synth.kind] += 1
                delays[synth.kind].append(first - onset)
    return {"tp": tp, "fp": fp, "detected": detected, "faults": faults, "delays": delays,
            "clean_steps": clean_steps, "clean_false": clean_false}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=264)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    runs = [generate(KINDS[i % len(KINDS)], rng) for i in range(args.runs)]
    steps = sum(len(s.records) for s in runs)
    start = time.process_time()
    ours = score(runs, baseline=False)
    elapsed = time.process_time() - start  # CPU time: the machine may be shared
    base = score(runs, baseline=True)
    print(f"{len(runs)} runs, {steps} records, seed {args.seed}; rules replay {elapsed:.1f}s CPU "
          f"({elapsed / steps * 1e6:.0f} us CPU per record, all detectors + stall watch)\n")
    print(f"{'fault':<16} {'runs':>4}  {'recall':>7} {'baseline':>8}  {'delay (records, median)':>24}")
    total_f = total_d = total_bd = 0
    for kind in KINDS:
        if kind not in ACCEPT:
            continue
        f = ours["faults"][kind]
        d, bd = ours["detected"][kind], base["detected"][kind]
        total_f, total_d, total_bd = total_f + f, total_d + d, total_bd + bd
        delay = median(ours["delays"][kind]) if ours["delays"][kind] else float("nan")
        bdelay = median(base["delays"][kind]) if base["delays"][kind] else float("nan")
        print(f"{kind:<16} {f:>4}  {d / f:>7.2f} {bd / f:>8.2f}  {delay:>12.0f} (baseline {bdelay:.0f})")
    print(f"{'all faults':<16} {total_f:>4}  {total_d / total_f:>7.3f} {total_bd / total_f:>8.3f}")
    stalls = [s for s in runs if s.kind == "stall"]
    ours_s = [s.params["stall_after"] for s in stalls if "stall_after" in s.params]
    base_s = [s.params["stall_after_baseline"] for s in stalls if "stall_after_baseline" in s.params]
    gaps = [s.params["gap"] for s in stalls]
    print(f"stall: silences of {min(gaps):.0f}-{max(gaps):.0f}s; alert after a median {median(ours_s):.0f}s of silence "
          f"(baseline: {median(base_s) if base_s else float('nan'):.0f}s, {len(base_s)}/{len(stalls)} found)\n")
    rules = sorted(set(ours["tp"]) | set(ours["fp"]) | set(base["tp"]) | set(base["fp"]) | set(PRIMARY.values()))
    print(f"{'rule':<18} {'precision':>9} {'alerts':>6}  {'baseline':>8} {'alerts':>6}")
    for rule in rules:
        def prec(s: dict[str, Any]) -> str:
            n = s["tp"][rule] + s["fp"][rule]
            return f"{s['tp'][rule] / n:.2f}" if n else "-"
        print(f"{rule:<18} {prec(ours):>9} {ours['tp'][rule] + ours['fp'][rule]:>6}  {prec(base):>8} {base['tp'][rule] + base['fp'][rule]:>6}")
    for name, s in (("flightlog rules", ours), ("fixed thresholds", base)):
        rate = s["clean_false"] / s["clean_steps"] * 1e4
        print(f"\n{name}: {s['clean_false']} false alerts on {s['clean_steps']} clean steps = {rate:.2f} per 10,000 clean steps", end="")
    print()
    recall = total_d / total_f
    rate = ours["clean_false"] / ours["clean_steps"] * 1e4
    ok = recall >= 0.95 and rate <= 1.0
    print(f"\ngoal (recall >= 0.95, <= 1 false alert per 10,000 clean steps): {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
