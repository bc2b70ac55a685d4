"""Prometheus rules: promtool accepts the generated file, and a real Prometheus fires the
stall alert when a run stops logging.

The exporter sink is another issue's work and not on this branch yet; the end-to-end test
therefore serves the gauges it will export (``flightlog.promnames``) with prometheus_client
from a small sink inside the test, fed by a real ``flightlog`` run.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

import flightlog
from flightlog import promnames
from flightlog.cli import main as cli
from flightlog.rules.config import load
from flightlog.rules.promrules import build_rules, render

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)  # type: ignore[list-item]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (scripts/system-deps installs it)")
def test_promtool_accepts_generated_rules(tmp_path: Path, capsys: Any) -> None:
    """The CLI writes the file; promtool finds all seven rules; thresholds follow the rules YAML."""
    rules_yaml = tmp_path / "rules.yaml"
    rules_yaml.write_text("loss_spike: {sigmas: 4, jump: 0.8}\nmemory_pressure: {fraction: 0.9}\n")
    out = tmp_path / "flightlog.rules.yml"
    assert cli(["alerts", "prometheus-rules", "-o", str(out), "--rules", str(rules_yaml), "--stall-seconds", "300",
                "--matchers", 'job="train"']) == 0
    result = promtool_check(out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout
    rules = {r["alert"]: r for r in yaml.safe_load(out.read_text())["groups"][0]["rules"]}
    assert rules["FlightlogStall"]["expr"] == 'time() - flightlog_last_step_timestamp_seconds{job="train"} > 300'
    assert "> 4 * stddev_over_time" in rules["FlightlogLossSpike"]["expr"]
    assert rules["FlightlogLossJump"]["expr"].endswith("> 0.8")
    assert rules["FlightlogMemoryPressure"]["expr"].endswith("> 0.9")
    assert rules["FlightlogNonfinite"]["labels"]["severity"] == "critical"
    assert rules["FlightlogRuleAlert"]["expr"] == 'increase(flightlog_alerts_total{job="train"}[5m]) > 0'


def test_cli_errors(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss_spike: {sigma: 3}\n")
    assert cli(["alerts", "prometheus-rules", "--rules", str(bad)]) == 2
    assert "rules.loss_spike.sigma" in capsys.readouterr().err
    assert cli(["alerts", "prometheus-rules", "--stall-seconds", "0"]) == 2
    assert cli(["alerts"]) == 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GaugeSink:
    """Stand-in for the exporter sink: the gauges of flightlog.promnames, from real records."""

    name = "prom-test"

    def __init__(self, registry: Any, run_labels: dict[str, str]) -> None:
        from prometheus_client import Gauge

        labels = list(run_labels)
        self.values = run_labels
        self.step = Gauge(promnames.LAST_STEP, "last step", labels, registry=registry)
        self.ts = Gauge(promnames.LAST_STEP_TIMESTAMP, "time of the last step", labels, registry=registry)
        self.loss = Gauge(promnames.metric_name("loss"), "loss", labels, registry=registry)

    def write(self, batch: list[dict[str, Any]]) -> None:
        for r in batch:
            if r.get("type") == "metrics" and "step" in r:
                self.step.labels(**self.values).set(r["step"])
                self.ts.labels(**self.values).set(flightlog.protocol.parse_timestamp(r["timestamp"]))
                self.loss.labels(**self.values).set(r["loss"])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _alerts(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5) as response:
        return json.load(response)["data"]["alerts"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (scripts/system-deps installs it)")
def test_real_prometheus_fires_stall_when_logging_stops(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    exporter_port, prom_port = _port(), _port()
    http_server, _ = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    rules_file = tmp_path / "flightlog.rules.yml"
    rules_file.write_text(render(build_rules(load(True), stall_seconds=4, for_="0s")))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_file)],
        "scrape_configs": [{"job_name": "train", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
    }))
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",  # type: ignore[list-item]
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = None
    try:
        sink = GaugeSink(registry, {"run": "prom-e2e", "run_id": "e2e"})
        run = flightlog.init(output_dir=tmp_path / "out", run_name="prom-e2e", sinks=["jsonl", sink],
                             install_signal_handlers=False, flush_interval=0.1)
        seen_while_logging: list[str] = []
        ready = False
        start = time.monotonic()
        step = 0
        while time.monotonic() - start < 20 and not (ready and time.monotonic() - start > 8):
            step += 1
            run.log({"loss": 2.0 - step * 1e-3}, step=step)
            time.sleep(0.1)
            if step % 10 == 0:
                try:
                    firing = [a["labels"]["alertname"] for a in _alerts(prom_port)]
                    ready = True
                except OSError:
                    continue  # Prometheus still starting
                seen_while_logging += firing
        assert ready, "Prometheus did not come up"
        assert "FlightlogStall" not in seen_while_logging
        stopped = time.monotonic()  # logging stops here; the process stays alive
        fired = None
        while fired is None and time.monotonic() - stopped < 30:
            time.sleep(0.5)
            fired = next((a for a in _alerts(prom_port) if a["labels"]["alertname"] == "FlightlogStall" and a["state"] == "firing"), None)
        assert fired is not None, "the stall alert did not fire within 30s of logging stopping"
        assert fired["labels"]["run"] == "prom-e2e" and fired["labels"]["severity"] == "critical"
        assert time.monotonic() - stopped >= 4  # not before the stall limit
    finally:
        if run is not None:
            run.finish()
        prom.terminate()
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
        http_server.shutdown()
