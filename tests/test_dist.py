"""Distributed runs: reduction across ranks, rank-0 writing, rank streams, stragglers,
hang safety. The slow tests launch real torchrun jobs (gloo, CPU) running
tests/dist_worker.py, whose ranks also write the values they logged, so the expected
reductions are computed here independently of flightlog."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import flightlog
from flightlog.config import ConfigError, build_config
from flightlog.dist.policy import Policy
from flightlog.dist.straggler import StragglerDetector

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "dist_worker.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore")


def torchrun(out: Path, nproc: int, *args: str, timeout: float = 120) -> None:
    cmd = [TORCHRUN, "--nproc_per_node", str(nproc), "--master_port", str(free_port()), WORKER, "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def local_values(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"local-rank-{r}.json").read_text()) for r in range(world)]


def metrics_by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records if r["type"] == "metrics"}


# ---------------------------------------------------------------------- policy and config
class TestPolicy:
    def test_defaults(self) -> None:
        """Memory is max, throughput is summed, everything else is averaged."""
        p = Policy()
        assert p.op("gpu_memory_peak_mb") == "max"
        assert p.op("throughput_tokens_per_sec") == "sum"
        assert p.op("loss") == "mean"

    def test_exact_names_beat_globs_and_weight_is_summed(self) -> None:
        """User names first, then user globs in order, then defaults; the weight metric is summed."""
        p = Policy({"grad_norm": "max", "eval_*": "min", "gpu_memory_mb": "mean"}, weight="num_tokens")
        assert p.op("grad_norm") == "max"
        assert p.op("eval_loss") == "min"
        assert p.op("gpu_memory_mb") == "mean"
        assert p.op("num_tokens") == "sum"

    def test_rejects_unknown_op(self) -> None:
        with pytest.raises(ValueError, match="avg"):
            Policy({"loss": "avg"})


class TestConfig:
    @pytest.mark.parametrize(
        "key,value",
        [("dist_policy", {"loss": "avg"}), ("dist_mode", "all"), ("dist_timeout", 0), ("straggler_patience", 0),
         ("straggler_margin", -1.0), ("dist_on_failure", "ignore"), ("dist_weight", "")],
    )
    def test_bad_values_name_the_key(self, key: str, value: object) -> None:
        with pytest.raises(ConfigError, match=key):
            build_config(env={}, **{key: value})

    def test_policy_from_environment(self) -> None:
        """FLIGHTLOG_DIST_POLICY is JSON; a bad op names the variable."""
        cfg = build_config(env={"FLIGHTLOG_DIST_POLICY": '{"loss": "max"}', "FLIGHTLOG_DIST_TIMEOUT": "5"})
        assert cfg.dist_policy == {"loss": "max"} and cfg.dist_timeout == 5.0
        with pytest.raises(ConfigError, match="FLIGHTLOG_DIST_POLICY"):
            build_config(env={"FLIGHTLOG_DIST_POLICY": '{"loss": "median"}'})


# ---------------------------------------------------------------------- straggler detector
class TestStraggler:
    def test_alerts_after_patience_once_and_rearms(self) -> None:
        """Same rank lagging `patience` times in a row: one alert; it re-arms after recovery."""
        d = StragglerDetector(margin=0.2, patience=3)
        slow = [0.1, 0.1, 0.2]
        findings = [d.update([5, 5, 5], slow) for _ in range(5)]
        assert [len(f.alerts) for f in findings] == [0, 0, 1, 0, 0]
        assert findings[0].fields["slowest_rank"] == 2
        assert findings[0].fields["slowest_rank_lag_s"] == pytest.approx(0.1)
        rule, message, fields = findings[2].alerts[0]
        assert rule == "straggler" and "rank 2" in message and fields["rank"] == 2
        assert d.update([5, 5, 5], [0.1, 0.1, 0.105]).alerts == []  # within margin: recovered
        assert [len(d.update([5, 5, 5], slow).alerts) for _ in range(3)] == [0, 0, 1]

    def test_noise_and_changing_ranks_do_not_alert(self) -> None:
        d = StragglerDetector(margin=0.2, patience=2)
        assert all(not d.update([1, 1], t).alerts for t in ([0.1, 0.3], [0.3, 0.1], [0.1, 0.3], [0.3, 0.1]))
        assert not d.update([1, 1], [0.10, 0.11]).alerts

    def test_rank_one_step_behind(self) -> None:
        """A rank reporting an earlier step than the others is named at once."""
        d = StragglerDetector()
        f = d.update([10, 10, 10, 9], [math.nan] * 4, [100.0, 300.0, 200.0, 50.0])
        assert f.alerts[0][0] == "rank_behind" and "rank 3 at step 9" in f.alerts[0][1]
        assert f.fields == {"peak_memory_mb": 300.0, "peak_memory_rank": 1}
        assert not d.update([11, 11, 11, 10], [math.nan] * 4).alerts  # same situation: not repeated

    def test_validates(self) -> None:
        with pytest.raises(ValueError, match="straggler_patience"):
            StragglerDetector(patience=0)


# ---------------------------------------------------------------------- in-process
def test_missing_ranks_are_those_that_never_check_in() -> None:
    """The diagnosis after a failed collective, on a real c10d store: absent keys name the ranks."""
    import time

    from torch.distributed import HashStore

    from flightlog.dist.comm import missing_ranks, wait_key

    store = HashStore()
    for r in (0, 2):
        store.set(f"ns/alive/7/{r}", "1")
    assert missing_ranks(store, "ns/alive/7", 4, time.monotonic() + 0.2, skip=0) == [1, 3]
    store.set("ns/alive/7/1", "1")
    store.set("ns/alive/7/3", "1")
    assert missing_ranks(store, "ns/alive/7", 4, time.monotonic() + 5.0) == []
    assert wait_key(store, "ns/alive/7/1", time.monotonic()) and not wait_key(store, "nope", time.monotonic() + 0.1)


def test_import_flightlog_does_not_import_torch() -> None:
    code = "import sys, flightlog, flightlog.dist; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=env())


def test_without_process_group_init_is_a_plain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch imported, no group, no launcher: the same code is the ordinary Run."""
    import torch.distributed  # noqa: F401

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False)
    assert type(run) is flightlog.Run
    run.log({"loss": 2.0}, step=1)
    run.finish()
    assert metrics_by_step(read(tmp_path / "logs" / "train.jsonl"))[1]["loss"] == 2.0


def test_launcher_rank_without_group_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK=1 of WORLD_SIZE=2 before init_process_group: same API, no main stream, no run.json."""
    import torch.distributed  # noqa: F401

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with flightlog.init(output_dir=tmp_path, sinks=["jsonl", "console"], install_signal_handlers=False) as run:
        run.log({"loss": 1.0}, step=1)
        run.event("hello")
        run.alert("r", "m")
        run.checkpoint("saved", tmp_path / "ckpt")
    assert not (tmp_path / "logs" / "train.jsonl").exists() and not (tmp_path / "logs" / "run.json").exists()
    monkeypatch.setenv("RANK", "0")
    with flightlog.init(output_dir=tmp_path / "r0", sinks=["jsonl"], install_signal_handlers=False) as run:
        run.log({"loss": 1.0}, step=1)
    records = read(tmp_path / "r0" / "logs" / "train.jsonl")
    assert any(r["type"] == "event" and "not initialised" in r["message"] for r in records)
    assert metrics_by_step(records)[1]["loss"] == 1.0


def test_one_rank_group_goes_through_the_reduction(tmp_path: Path) -> None:
    """A one-rank gloo group takes the full code path: values survive it unchanged, types kept."""
    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with flightlog.init(output_dir=tmp_path, sinks=["jsonl"], rank_streams=True, install_signal_handlers=False) as run:
            assert type(run).__name__ == "DistributedRun"
            run.on_log(lambda m, s: {"gpu_memory_mb": torch.tensor(7.5)})
            run.log({"loss": torch.tensor(1.25), "tokens": 3, "n": np.int64(4), "stage": "warmup", "ok": True}, step=1)
            run.log({"loss": 0.5, "throughput_samples_per_sec": 10}, step=2)  # a different key set: new hash
            layer = torch.nn.Linear(3, 2)
            layer(torch.ones(4, 3)).pow(2).sum().backward()
            from flightlog.collect import GradNorms

            norms = GradNorms(layer.named_parameters()).compute()  # values derived from one vector
            run.log({"loss": 0.25, **norms}, step=3)
            run.log({"loss": 0.125, "shape": torch.Size([1])}, step=4)  # a torch object, not a tensor: refused by name on the writer
            expected_norm = float(torch.nn.utils.clip_grad_norm_(layer.parameters(), float("inf")))
        records = metrics_by_step(read(tmp_path / "logs" / "train.jsonl"))
        assert records[3]["grad_norm"] == pytest.approx(expected_norm, rel=1e-6)
        from flightlog.dist.reduce import _number

        assert _number(norms["grad_norm"], device_ok=True) == pytest.approx(expected_norm, rel=1e-6)  # reduced, not skipped
        first = records[1]
        assert first["loss"] == 1.25 and first["tokens"] == 3 and first["n"] == 4.0
        assert first["stage"] == "warmup" and first["ok"] is True and first["gpu_memory_mb"] == 7.5
        assert first["peak_memory_rank"] == 0 and "slowest_rank" not in first
        assert records[2]["throughput_samples_per_sec"] == 10 and type(records[2]["throughput_samples_per_sec"]) is int
        assert records[4]["loss"] == 0.125 and "shape" not in records[4]
        local = metrics_by_step(read(tmp_path / "logs" / "rank-0.jsonl"))
        assert local[1]["rank"] == 0 and local[1]["loss"] == 1.25
    finally:
        dist.destroy_process_group()


def test_step_timer_records_are_whole_when_a_group_reduces_them(tmp_path: Path) -> None:
    """Under a distributed run StepTimer hands run.log whole records (the reduction needs
    every value at once): the collectors' fields go through the one-rank gloo group."""
    import math

    import torch
    import torch.distributed as dist

    from flightlog.collect import Collectors, StepTimer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        expected: dict[int, float] = {}
        with flightlog.init(output_dir=tmp_path, sinks=["jsonl"], logging_steps=2, install_signal_handlers=False) as run:
            assert type(run).__name__ == "DistributedRun"
            timer = StepTimer(run, collectors=Collectors(model=model, optimizer=opt, warmup_steps=2, system=False), batch_size=8)
            for _ in range(4):
                with timer.step() as step:
                    loss = model(torch.randn(8, 4)).pow(2).mean()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if timer.next_is_logged:
                        expected[timer.step_count + 1] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
                    opt.step()
                    step.log(loss=loss)
        records = metrics_by_step(read(tmp_path / "logs" / "train.jsonl"))
        assert sorted(records) == [2, 4]
        for step_number, record in records.items():
            assert record["grad_norm"] == pytest.approx(expected[step_number], rel=1e-5)
            assert record["learning_rate"] == 0.05 and record["precision"] == "fp32"
            assert record["step_time_s"] > 0 and record["throughput_samples_per_sec"] > 0 and type(record["loss"]) is float
        assert [records[2]["stage"], records[4]["stage"]] == ["warmup", "stable"]
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_nccl_one_rank_no_host_sync(tmp_path: Path) -> None:
    """One-rank NCCL group, CUDA tensors: log() adds no host-device sync on the training thread."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False) as run:
            x = torch.randn(256, 256, device="cuda")
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                for step in range(1, 6):
                    loss = (x @ x).mean()
                    run.log({"loss": loss, "grad_norm": loss * 2, "lr": 0.1}, step=step)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            expected = float((x @ x).mean())
        m = metrics_by_step(read(tmp_path / "logs" / "train.jsonl"))
        assert m[5]["loss"] == pytest.approx(expected, rel=1e-5) and m[5]["grad_norm"] == pytest.approx(2 * expected, rel=1e-5)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------- torchrun jobs
@pytest.mark.slow
def test_torchrun_two_ranks_ddp_reduce_streams_straggler_and_figures(tmp_path: Path) -> None:
    """2 ranks training with DistributedDataParallel: mean/max/sum as computed from each rank's
    own values, one main stream, rank streams with identity, rank 1's injected delay reported as
    the straggler. Then a second run in the same processes with dist_mode='figures' (what the HF
    callback uses: the Trainer already averaged) writes rank 0's values untouched."""
    torchrun(tmp_path, 2, "--ddp", "--rank-streams", "--delay-rank", "1", "--delay", "0.08", "--steps", "10",
             "--also-figures")
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl", "run.json", "train.jsonl"]
    records = read(logs / "train.jsonl")
    assert [r["type"] for r in records].count("run_start") == 1
    start = records[0]
    assert [r["rank"] for r in start["ranks"]] == [0, 1] and start["world_size"] == 2
    local = local_values(tmp_path, 2)
    assert [v["type"] for v in local] == ["DistributedRun", "FollowerRun"]
    assert local[0]["steps"]["10"]["loss"] != local[1]["steps"]["10"]["loss"]  # a real per-rank difference
    got = metrics_by_step(records)
    assert sorted(got) == list(range(1, 11))
    for step, rec in got.items():
        vals = [v["steps"][str(step)] for v in local]
        assert rec["loss"] == pytest.approx(sum(v["loss"] for v in vals) / 2, rel=1e-12)
        assert rec["gpu_memory_peak_mb"] == max(v["gpu_memory_peak_mb"] for v in vals)
        assert rec["throughput_samples_per_sec"] == sum(v["throughput_samples_per_sec"] for v in vals)
        assert rec["stage"] == "stable"
    assert all(got[s]["slowest_rank"] == 1 for s in range(3, 11))
    assert got[5]["slowest_rank_lag_s"] > 0.05
    # The diagnosis rules may also flag the toy loss (it swings by ~100 in 10 steps); this test is about the straggler.
    alerts = [r for r in records if r["type"] == "alert" and r["rule"] == "straggler"]
    assert len(alerts) == 1 and alerts[0]["rank"] == 1
    assert "rank 1" in alerts[0]["message"]
    for rank in (0, 1):
        stream = read(logs / f"rank-{rank}.jsonl")
        assert stream[0]["type"] == "run_start" and stream[0]["rank"] == rank
        assert stream[0]["host"] == socket.gethostname() and stream[0]["node_address"]
        assert stream[0]["run_id"] == start["run_id"]
        mine = metrics_by_step(stream)
        assert all(mine[s]["rank"] == rank and mine[s]["loss"] == local[rank]["steps"][str(s)]["loss"] for s in mine)
        assert stream[-1]["type"] == "run_end"
    assert json.loads((logs / "run.json").read_text())["status"] == "finished"

    figures = tmp_path / "figures"
    local = local_values(figures, 2)
    got = metrics_by_step(read(figures / "logs" / "train.jsonl"))
    assert sorted(got) == list(range(1, 11))
    for step, rec in got.items():
        mine = local[0]["steps"][str(step)]
        assert rec["loss"] == mine["loss"] and rec["throughput_samples_per_sec"] == mine["throughput_samples_per_sec"]
        assert rec["peak_memory_rank"] in (0, 1)
    assert got[10]["slowest_rank"] == 1


@pytest.mark.slow
def test_torchrun_three_ranks_weighted_thinned_and_mismatched_keys(tmp_path: Path) -> None:
    """3 ranks, dist_weight=num_tokens, logging_steps=3, one rank logging an extra key:
    token-weighted means, summed token counts, the extra key from its one rank, no hang."""
    torchrun(tmp_path, 3, "--weight", "num_tokens", "--extra-key-rank", "2", "--logging-steps", "3")
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["run.json", "train.jsonl"]
    records = read(logs / "train.jsonl")
    got = metrics_by_step(records)
    assert sorted(got) == [3, 6, 9, 12]
    local = local_values(tmp_path, 3)
    for step, rec in got.items():
        vals = [v["steps"][str(step)] for v in local]
        w = [v["num_tokens"] for v in vals]
        assert rec["loss"] == pytest.approx(sum(wi * v["loss"] for wi, v in zip(w, vals)) / sum(w), rel=1e-12)
        assert rec["num_tokens"] == sum(w) and type(rec["num_tokens"]) is int
        assert rec["extra_metric"] == vals[2]["extra_metric"]
    events = [r for r in records if r["type"] == "event" and "different metrics" in r["message"]]
    assert len(events) == 1 and "rank 0 does not log extra_metric" in events[0]["message"]


@pytest.mark.slow
def test_two_nodes_on_loopback_one_stream(tmp_path: Path) -> None:
    """Two torchrun 'nodes' (--nnodes 2 --node_rank 0/1) on 127.0.0.1 write one coherent stream."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [TORCHRUN, "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
             "--master_port", port, WORKER, "--out", str(tmp_path), "--rank-streams", "--steps", "6"],
            env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl", "run.json", "train.jsonl"]
    records = read(logs / "train.jsonl")
    assert [r["type"] for r in records].count("run_start") == 1 and records[-1]["type"] == "run_end"
    assert [(r["rank"], r["node_rank"]) for r in records[0]["ranks"]] == [(0, 0), (1, 1)]
    assert len({r["run_id"] for r in records}) == 1
    local = local_values(tmp_path, 2)
    got = metrics_by_step(records)
    assert sorted(got) == list(range(1, 7))
    for step, rec in got.items():
        assert rec["loss"] == pytest.approx(sum(v["steps"][str(step)]["loss"] for v in local) / 2, rel=1e-12)
    assert read(logs / "rank-1.jsonl")[0]["node_rank"] == 1


def spawn_ranks(out: Path, world: int, *args: str) -> list[subprocess.Popen]:
    """Ranks started directly (no torchrun agent, which would itself kill the survivors)."""
    base = dict(env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    return [
        subprocess.Popen([sys.executable, WORKER, "--out", str(out), *args], env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("how,world", [("kill", 3), ("stop", 2)])
def test_dead_or_hung_rank_is_named_and_the_others_end(tmp_path: Path, how: str, world: int) -> None:
    """Rank 1 killed (or frozen) at step 5: the others end within dist_timeout with an event naming rank 1."""
    timeout = 3.0
    procs = spawn_ranks(tmp_path, world, "--steps", "40", "--die-rank", "1", "--die-step", "5", "--die-how", how,
                        "--timeout", str(timeout))
    try:
        survivors = [p for r, p in enumerate(procs) if r != 1]
        for p in survivors:
            p.wait(timeout=120)
        assert [p.returncode for p in survivors] == [0] * len(survivors), [p.stderr.read() for p in survivors]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for r in range(world):
        if r == 1:
            continue
        result = json.loads((tmp_path / f"local-rank-{r}.json").read_text())
        assert result["status"] == "DistributedTimeout ranks=[1]"
        assert result["failed_in"] <= timeout + 2.0, result
    records = read(tmp_path / "logs" / "train.jsonl")
    critical = [r for r in records if r["type"] == "event" and r["level"] == "CRITICAL"]
    assert len(critical) == 1 and critical[0]["ranks"] == [1] and critical[0]["step"] == 5
    assert critical[0]["message"].startswith("rank 1 stopped answering")
    assert max(metrics_by_step(records)) == 4
    assert records[-1]["type"] == "run_end" and records[-1]["status"] == "failed"
