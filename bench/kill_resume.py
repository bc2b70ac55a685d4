"""Kill a deterministic CPU training with SIGKILL many times and resume it each time;
check that it ends bit-identical to an uninterrupted run. Prints a table.

    PYTHONPATH=src python bench/kill_resume.py            # 50 kills (25 at steps, 25 inside saves) + 10 timed
    PYTHONPATH=src python bench/kill_resume.py --kills 50 --timed 10 --seed 1

Kinds of kill:
- step:  SIGKILL right after a step is logged (before its save), at random steps;
- save:  SIGKILL inside a checkpoint save, after a random one of its 9 stages (7 files,
         manifest, rename), half of them with asynchronous saving;
- timed: SIGKILL from outside at a random moment once training runs (separate processes).
The step/save kills run in children forked from one process that imported torch once
(tests/ckpt_train.py --chain); each child is a real process and a real SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "ckpt_train.py"
STAGES = 9


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def base_args(out: Path, steps: int, save: int) -> list[str]:
    return ["--output-dir", str(out), "--steps", str(steps), "--save-steps", str(save), "--width", "64"]


def chain(work: Path, launches: list[list[str]]) -> list[dict]:
    plan, report = work / "plan.json", work / "report.json"
    plan.write_text(json.dumps(launches))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--chain", str(plan), str(report)], env=env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"chain failed:\n{proc.stderr[-3000:]}")
    result = json.loads(report.read_text())
    if result[-1]["rc"] != 0:
        sys.exit(f"the final launch failed: {result[-1]}\n{proc.stderr[-3000:]}")
    return result


def compare(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    same = all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"])
    same &= all(torch.equal(v, y["optimizer"]["state"][p][n]) for p, s in x["optimizer"]["state"].items() for n, v in s.items())
    return same and x["scaler"] == y["scaler"] and x["sched"] == y["sched"]


def checkpoint_stats(logs: Path) -> dict[str, float]:
    from flightlog.checkpoint.continuity import read_stream

    saved = [r for _, r in read_stream(logs) if r.get("type") == "checkpoint" and r.get("status") == "saved"]
    loaded = [r for _, r in read_stream(logs) if r.get("type") == "checkpoint" and r.get("status") == "loaded"]
    events = [r for _, r in read_stream(logs) if r.get("continuity")]
    return {
        "saves": len(saved),
        "save_ms": 1000 * sum(r["seconds"] for r in saved) / max(1, len(saved)),
        "blocking_ms": 1000 * sum(r.get("blocking_seconds", r["seconds"]) for r in saved) / max(1, len(saved)),
        "loads": len(loaded),
        "load_ms": 1000 * sum(r["seconds"] for r in loaded) / max(1, len(loaded)),
        "continuity": ",".join(sorted({e["continuity"] for e in events})) or "-",
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=50, help="step and save kills together (half each)")
    p.add_argument("--timed", type=int, default=10, help="extra kills from outside at random moments")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    from flightlog.checkpoint import metric_series

    rows = []
    with tempfile.TemporaryDirectory(prefix="flightlog-bench-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        subprocess.run([sys.executable, str(SCRIPT), *base_args(work / "base", args.steps, args.save_steps), "--final", str(work / "base.pt")], env=env(), check=True, capture_output=True)
        expected = metric_series(work / "base" / "logs")
        rows.append(("uninterrupted", 0, "-", "-", "-", time.perf_counter() - start, checkpoint_stats(work / "base" / "logs")))

        for kind, n in (("step", args.kills // 2), ("save", args.kills - args.kills // 2)):
            out = work / kind
            launches: list[list[str]] = []
            expect: list[str | None] = []
            latest = 0
            for _ in range(n):
                if kind == "step":
                    k = rng.randint(latest + 1, min(args.steps - 1, latest + 3 * args.save_steps))
                    launches.append(base_args(out, args.steps, args.save_steps) + ["--kill-at", str(k)])
                    latest = (k - 1) // args.save_steps * args.save_steps
                else:
                    stage = rng.randint(1, STAGES)
                    s = min(args.steps, latest + args.save_steps * rng.choice([1, 1, 2]))
                    launches.append(base_args(out, args.steps, args.save_steps) + ["--kill-in-save", f"{s}:{stage}"] + (["--async-save"] if rng.random() < 0.5 else []))
                    latest = s if stage == STAGES else s - args.save_steps
                expect.append(f"checkpoint-{latest}" if latest else None)
            launches.append(base_args(out, args.steps, args.save_steps) + ["--final", str(work / f"{kind}.pt")])
            start = time.perf_counter()
            report = chain(work, launches)
            elapsed = time.perf_counter() - start
            killed = sum(1 for e in report if e["signal"] == signal.SIGKILL)
            chosen_ok = all(e["latest"] == x for e, x in zip(report, expect))
            never_partial = all(not e["skipped"] for e in report)
            same = compare(work / "base.pt", work / f"{kind}.pt") and metric_series(out / "logs") == expected
            rows.append((f"SIGKILL at {kind}", killed, "yes" if chosen_ok and never_partial else "NO", "yes" if same else "NO", "yes" if report[-1]["rc"] == 0 else "NO", elapsed, checkpoint_stats(out / "logs")))

        if args.timed:
            out = work / "timed"
            killed = 0
            start = time.perf_counter()
            stream = out / "logs" / "train.jsonl"
            for _ in range(args.timed):
                size = stream.stat().st_size if stream.exists() else 0
                proc = subprocess.Popen([sys.executable, str(SCRIPT), *base_args(out, args.steps, args.save_steps)], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                # Wait until this process is training (its records reach the stream), then
                # kill it at a random moment of the training.
                while proc.poll() is None and (stream.stat().st_size if stream.exists() else 0) < size + 2000:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.8))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    killed += 1
                proc.wait()
            subprocess.run([sys.executable, str(SCRIPT), *base_args(out, args.steps, args.save_steps), "--final", str(work / "timed.pt")], env=env(), check=True, capture_output=True)
            same = compare(work / "base.pt", work / "timed.pt") and metric_series(out / "logs") == expected
            rows.append(("SIGKILL timed", killed, "-", "yes" if same else "NO", "yes", time.perf_counter() - start, checkpoint_stats(out / "logs")))

    print(f"steps={args.steps} save_steps={args.save_steps} seed={args.seed} model=MLP(8-64-1)+dropout, AdamW, LambdaLR, GradScaler")
    head = f"{'scenario':<16} {'kills':>5} {'right ckpt':>10} {'bit-identical':>13} {'finished':>8} {'wall s':>7} {'saves':>5} {'save ms':>7} {'block ms':>8} {'loads':>5} {'load ms':>7} continuity"
    print(head)
    print("-" * len(head))
    for name, kills, right, same, done, wall, st in rows:
        print(f"{name:<16} {kills:>5} {right:>10} {same:>13} {done:>8} {wall:>7.1f} {st['saves']:>5} {st['save_ms']:>7.1f} {st['blocking_ms']:>8.1f} {st['loads']:>5} {st['load_ms']:>7.1f} {st['continuity']}")
    return 0 if all(r[3] in ("yes", "-") and r[2] in ("yes", "-") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
