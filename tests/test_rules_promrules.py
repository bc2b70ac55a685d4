"""Prometheus rules: promtool accepts the generated file, and a real Prometheus scraping
flightlog's own exporter sink fires the stall alert when a run stops logging (and the
rule-alert rule when the run's own rules raise an alert)."""

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
    assert rules["FlightlogRuleAlert"]["expr"].startswith('(increase(flightlog_alerts_total{job="train"}[5m]) > 0) or ')


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


def _alerts(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5) as response:
        return json.load(response)["data"]["alerts"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (scripts/system-deps installs it)")
def test_real_prometheus_fires_stall_when_logging_stops(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    run = flightlog.init(output_dir=tmp_path / "out", run_name="prom-e2e", sinks=["jsonl", "prometheus"], prometheus_port=0,
                         install_signal_handlers=False, flush_interval=0.1)
    exporter = next(s for s in run.sinks if getattr(s, "name", "") == "prometheus")
    prom_port = _port()
    rules_file = tmp_path / "flightlog.rules.yml"
    rules_file.write_text(render(build_rules(load(True), stall_seconds=4, for_="0s")))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_file)],
        "scrape_configs": [{"job_name": "train", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}],
    }))
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",  # type: ignore[list-item]
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen_while_logging: list[dict[str, Any]] = []
        ready = False
        start = time.monotonic()
        step = 0
        while time.monotonic() - start < 25 and not (ready and time.monotonic() - start > 8):
            step += 1
            run.log({"loss": float("nan") if step == 30 else 2.0 - step * 1e-3}, step=step)  # one NaN: a live rule alert
            time.sleep(0.1)
            if step % 10 == 0:
                try:
                    seen_while_logging += _alerts(prom_port)
                    ready = True
                except OSError:
                    continue  # Prometheus still starting
        assert ready, "Prometheus did not come up"
        names = {a["labels"]["alertname"] for a in seen_while_logging}
        assert "FlightlogStall" not in names
        rule_alerts = [a for a in seen_while_logging if a["labels"]["alertname"] == "FlightlogRuleAlert"]
        assert rule_alerts and rule_alerts[0]["labels"]["rule"] == "nonfinite"
        stopped = time.monotonic()  # logging stops here; the process stays alive
        fired = None
        while fired is None and time.monotonic() - stopped < 30:
            time.sleep(0.5)
            fired = next((a for a in _alerts(prom_port) if a["labels"]["alertname"] == "FlightlogStall" and a["state"] == "firing"), None)
        assert fired is not None, "the stall alert did not fire within 30s of logging stopping"
        assert fired["labels"]["run"] == "prom-e2e" and fired["labels"]["run_id"] == run.run_id
        assert fired["labels"]["severity"] == "critical"
        assert time.monotonic() - stopped >= 3  # not before the stall limit (4 s after the last step)
    finally:
        run.finish()
        prom.terminate()
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
