"""The prometheus sink, scraped by a real Prometheus server (Debian's ``prometheus``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

import flightlog
from flightlog.config import ConfigError

pytest.importorskip("prometheus_client", reason="the prometheus extra is not installed (pip install 'flightlog[prometheus]')")

from flightlog.sinks.prometheus import PrometheusSink, metric_name  # noqa: E402

QUIET = dict(console_stream="stderr", install_signal_handlers=False)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "sinks.md"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, family: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(family + "{")]
    return float(line.rsplit(" ", 1)[1])


class PrometheusServer:
    """A real Prometheus on a free loopback port with its own config and storage, killed afterwards."""

    def __init__(self, tmp: Path, scrape_configs: list[dict[str, Any]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs}
        (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.logfile = tmp / "prometheus.log"

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, body = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        if status != 200:
            return []
        return json.loads(body)["data"]["result"]

    def wait_for(self, promql: str, want: float, timeout: float = 45.0) -> list[dict[str, Any]]:
        """Poll until the query returns ``want``; fails with Prometheus' view of its targets."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode}: {self.logfile.read_text()[-2000:]}")
            try:
                result = self.query(promql)
            except (urllib.error.URLError, ConnectionError, OSError):
                result = []
            if result and float(result[0]["value"][1]) == want:
                return result
            time.sleep(0.3)
        _, targets = get(f"{self.url}/api/v1/targets")
        pytest.fail(f"{promql} never returned {want} (last: {result}); targets: {targets[:1500]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("the Prometheus server binary is not installed (Debian: apt-get install prometheus; scripts/system-deps does it)")
    return path


@pytest.fixture
def start_prometheus(tmp_path: Path, prometheus_binary: str) -> Iterator[Any]:
    servers: list[PrometheusServer] = []

    def start(scrape_configs: list[dict[str, Any]]) -> PrometheusServer:
        directory = tmp_path / f"prometheus-{len(servers)}"
        directory.mkdir()
        servers.append(PrometheusServer(directory, scrape_configs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.mark.slow
def test_real_prometheus_scrapes_the_logged_loss(tmp_path: Path, start_prometheus: Any) -> None:
    """Prometheus finds the exporter through the file_sd target file, scrapes it, and a query returns the loss."""
    run = flightlog.init(tmp_path / "out", sinks=["jsonl", "prometheus"], prometheus_port=0, run_name="llama-lora", task_type="sft", **QUIET)
    try:
        targets = tmp_path / "out" / "logs" / "prometheus_targets.json"
        server = start_prometheus([{"job_name": "flightlog", "file_sd_configs": [{"files": [str(targets)]}]}])
        losses = [2.5 / step for step in range(1, 31)]
        for step, loss in enumerate(losses, start=1):
            run.log({"loss": loss, "learning_rate": 1e-4, "stage": "stable"}, step=step)
        run.log({"eval_loss": 0.75}, step=30)
        run.flush()
        result = server.wait_for('flightlog_loss{run="llama-lora"}', losses[-1])
        labels = result[0]["metric"]
        assert labels["run"] == "llama-lora" and labels["run_id"] == run.run_id and labels["job"] == "flightlog"
        assert server.wait_for('flightlog_last_step{run="llama-lora"}', 30)
        assert server.wait_for('flightlog_eval_loss{run="llama-lora"}', 0.75)
        assert server.wait_for('flightlog_records_total{run="llama-lora", type="metrics"}', 31)
        stamp = float(server.query('flightlog_last_step_timestamp_seconds{run="llama-lora"}')[0]["value"][1])
        assert abs(stamp - time.time()) < 120
        # The stall-alert expression from docs/sinks.md evaluates (the run is not stalled).
        assert server.query("time() - flightlog_last_step_timestamp_seconds > 600") == []
        run.log({"loss": 0.01}, step=31)
        run.flush()
        assert server.wait_for('flightlog_loss{run="llama-lora"}', 0.01)
    finally:
        run.finish()
    assert not targets.exists()  # the endpoint is gone, so is its discovery entry


@pytest.mark.slow
def test_token_protects_the_endpoint_and_prometheus_sends_it(tmp_path: Path, start_prometheus: Any) -> None:
    """With a token, an anonymous scrape gets 401 and Prometheus with credentials gets the metrics."""
    token = "s3cret-token-for-test"
    port = free_port()
    run = flightlog.init(tmp_path / "out", sinks=["prometheus"], prometheus_port=port, prometheus_token=token, run_name="guarded", **QUIET)
    try:
        run.log({"loss": 1.25}, step=7)
        run.flush()
        url = f"http://127.0.0.1:{port}/metrics"
        status, body = get(url)
        assert status == 401 and "flightlog_loss" not in body
        assert get(url, {"Authorization": "Bearer wrong-token-xyz"})[0] == 401
        status, body = get(url, {"Authorization": f"Bearer {token}"})
        assert status == 200 and sample(body, "flightlog_loss") == 1.25
        server = start_prometheus(
            [{"job_name": "guarded", "authorization": {"credentials": token}, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
        )
        server.wait_for('flightlog_loss{run="guarded"}', 1.25)
    finally:
        run.finish()


class TestExporter:
    def test_metrics_text(self, tmp_path: Path) -> None:
        """Gauges per metric labelled by run; NaN stays NaN; strings skipped; counters count records and alerts."""
        run = flightlog.init(tmp_path, sinks=["prometheus"], prometheus_port=0, run_name="r1", task_type="sft", model_name="tiny", **QUIET)
        try:
            run.log({"loss": float("nan"), "acc@1": 0.5, "stage": "warmup", "last_step": 99.0}, step=3, epoch=0.5)
            run.alert("loss_spike", "loss jumped", severity="critical", value=9.0, threshold=3.0, step=3)
            run.flush()
            (sink,) = run.sinks
            assert sink.url == f"http://127.0.0.1:{sink.port}/metrics"
            status, text = get(sink.url)
            assert get(sink.url.replace("/metrics", "/nothing"))[0] == 404
        finally:
            run.finish()
        assert status == 200
        labels = f'run="r1",run_id="{run.run_id}"'
        assert f"flightlog_loss{{{labels}}} NaN" in text
        assert f"flightlog_acc_1{{{labels}}} 0.5" in text
        assert f"flightlog_epoch{{{labels}}} 0.5" in text
        assert f"flightlog_last_step{{{labels}}} 3.0" in text  # the user's "last_step" metric does not shadow it
        assert "stage" not in text
        assert f'flightlog_records_total{{{labels},type="metrics"}} 1.0' in text
        assert f'flightlog_alerts_total{{rule="loss_spike",{labels},severity="critical"}} 1.0' in text  # labels sorted
        assert f'flightlog_run_info{{model_name="tiny",{labels},task_type="sft"}} 1.0' in text
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(sink.url, timeout=5)  # the endpoint closed with the run

    def test_metric_names(self) -> None:
        assert metric_name("eval_loss") == "flightlog_eval_loss"
        assert metric_name("train/loss.total-x") == "flightlog_train_loss_total_x"
        assert metric_name("records_total") is None and metric_name("last_step_timestamp_seconds") is None

    def test_own_registry(self, tmp_path: Path) -> None:
        """Two runs in one process export separately and leave the global registry alone."""
        from prometheus_client import REGISTRY, generate_latest

        a = PrometheusSink(port=0, run_name="a", run_id="ida")
        b = PrometheusSink(port=0, run_name="b", run_id="idb")
        try:
            a.write([{"type": "metrics", "step": 1, "loss": 1.0, "timestamp": "2026-01-01T00:00:00.000Z"}])
            b.write([{"type": "metrics", "step": 1, "loss": 2.0, "timestamp": "2026-01-01T00:00:00.000Z"}])
            assert sample(get(a.url)[1], "flightlog_loss") == 1.0
            assert sample(get(b.url)[1], "flightlog_loss") == 2.0
            assert sample(get(a.url)[1], "flightlog_last_step_timestamp_seconds") == 1767225600.0
            assert b"flightlog_" not in generate_latest(REGISTRY)
        finally:
            a.close()
            b.close()


class TestSafeDefaults:
    def test_port_taken_fails_init_naming_the_port(self, tmp_path: Path) -> None:
        """A port another process holds is a clear error at init, before any training time is spent."""
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            threads = set(threading.enumerate())
            with pytest.raises(ConfigError, match=rf"prometheus_port={port}: 127\.0\.0\.1:{port} is already in use"):
                flightlog.init(tmp_path, sinks=["jsonl", "tensorboard", "prometheus"], prometheus_port=port, **QUIET)
        # The sinks built before the failing one were closed: no open file under the run, no writer thread left.
        open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]
        assert not [f for f in open_files if f.startswith(str(tmp_path))]
        time.sleep(0.2)
        assert [t for t in threading.enumerate() if t not in threads and t.is_alive()] == []

    def test_non_loopback_needs_a_token(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Binding 0.0.0.0 without a token is refused, and the message says how to fix it."""
        monkeypatch.delenv("FLIGHTLOG_TOKEN", raising=False)
        with pytest.raises(ConfigError, match="needs a token; set FLIGHTLOG_TOKEN or prometheus_token"):
            flightlog.init(tmp_path, sinks=["prometheus"], prometheus_host="0.0.0.0", prometheus_port=0, **QUIET)

    def test_non_loopback_with_env_token(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """FLIGHTLOG_TOKEN allows a wider bind, and then every scrape must carry it."""
        monkeypatch.setenv("FLIGHTLOG_TOKEN", "env-token-12345")
        run = flightlog.init(tmp_path, sinks=["prometheus"], prometheus_host="0.0.0.0", prometheus_port=0, **QUIET)
        try:
            (sink,) = run.sinks
            url = f"http://127.0.0.1:{sink.port}/metrics"
            assert get(url)[0] == 401
            assert get(url, {"Authorization": "Bearer env-token-12345"})[0] == 200
            targets = json.loads((tmp_path / "logs" / "prometheus_targets.json").read_text())
            assert targets[0]["targets"] == [f"{socket.gethostname()}:{sink.port}"]
        finally:
            run.finish()

    @pytest.mark.parametrize(
        "key, value, expected",
        [
            ("prometheus_port", 70000, "0..65535"),
            ("prometheus_port", "9464", "0..65535"),
            ("prometheus_host", "", "host name"),
            ("histogram_interval", 0, ">= 1"),
        ],
    )
    def test_bad_config_names_the_key(self, tmp_path: Path, key: str, value: Any, expected: str) -> None:
        with pytest.raises(ConfigError, match=rf"{key}=.*{re.escape(expected)}"):
            flightlog.init(tmp_path, sinks=["prometheus"], **{key: value}, **QUIET)

    def test_bad_token_is_not_echoed(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError) as info:
            flightlog.init(tmp_path, sinks=["prometheus"], prometheus_token="short", **QUIET)
        assert "prometheus_token=<hidden>" in str(info.value) and "short" not in str(info.value)

    def test_env_port(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """FLIGHTLOG_PROMETHEUS_PORT is read like every other key."""
        port = free_port()
        monkeypatch.setenv("FLIGHTLOG_PROMETHEUS_PORT", str(port))
        run = flightlog.init(tmp_path, sinks=["prometheus"], **QUIET)
        try:
            assert run.sinks[0].port == port
        finally:
            run.finish()


def test_stall_alert_rule_in_docs_passes_promtool(tmp_path: Path) -> None:
    """The alert rules shown in docs/sinks.md are accepted by promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    text = DOCS.read_text()
    blocks = re.findall(r"```yaml\n(groups:.*?)```", text, flags=re.S)
    assert blocks, "docs/sinks.md should show the alert rules as a ```yaml block starting with groups:"
    rules = tmp_path / "rules.yml"
    rules.write_text(blocks[0])
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "flightlog_last_step_timestamp_seconds" in blocks[0]
