"""Notifiers against a local HTTP server: each service's payload, signatures, retries,
and a dead endpoint that must not slow the training loop."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

import flightlog
from flightlog.config import ConfigError
from flightlog.rules.notify import Channel, make_notifier, parse_spec

ALERT = {"type": "alert", "rule": "nonfinite", "severity": "critical", "message": "loss is nan", "value": float("nan"),
         "action": "stop and resume from the last good checkpoint", "step": 250, "timestamp": "2026-11-30T01:38:35.853Z"}
RUN = {"run_id": "20261130-013835-b67f02", "run_name": "llama3-lora-finetune", "host": "node1", "log_dir": "/tmp/x/logs"}


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []
        self.responses: list[tuple[int, bytes]] = []
        self.default = (200, b"ok")
        self.delay = 0.0

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (timeout test) is expected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.requests) >= n, f"expected {n} requests, got {len(self.requests)}"
        return self.requests


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        parts = urllib.parse.urlsplit(self.path)
        self.server.requests.append({"path": parts.path, "query": urllib.parse.parse_qs(parts.query),
                                     "headers": dict(self.headers), "body": json.loads(body)})
        if self.server.delay:
            time.sleep(self.server.delay)
        status, answer = self.server.responses.pop(0) if self.server.responses else self.server.default
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Recorder]:
    srv = Recorder()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def deliver(spec: dict[str, Any], alert: dict[str, Any] = ALERT) -> Channel:
    channel = Channel(make_notifier(parse_spec(spec, 0)), RUN)
    channel.submit(alert)
    assert channel.close(timeout=10.0)
    return channel


class TestPayloads:
    def test_slack_incoming_webhook(self, server: Recorder) -> None:
        """Slack: 'text' (required fallback) plus mrkdwn section blocks with the action."""
        channel = deliver({"type": "slack", "url": server.url + "/services/T0/B0/XYZ"})
        body = server.wait(1)[0]["body"]
        assert channel.sent == 1
        assert body["text"].startswith("[flightlog] CRITICAL nonfinite in run llama3-lora-finetune")
        assert "Action: stop and resume" in body["text"]
        assert [b["type"] for b in body["blocks"]] == ["section", "section"]
        assert body["blocks"][0]["text"]["type"] == "mrkdwn" and ":rotating_light:" in body["blocks"][0]["text"]["text"]

    def test_dingtalk_signature_and_markdown(self, server: Recorder) -> None:
        """DingTalk: timestamp (ms) and sign = base64(HMAC-SHA256(secret, ts+'\\n'+secret)) in the query."""
        secret = "SEC0123456789abcdef"
        server.default = (200, b'{"errcode":0,"errmsg":"ok"}')
        channel = deliver({"type": "dingtalk", "url": server.url + "/robot/send?access_token=tok123", "secret": secret})
        request = server.wait(1)[0]
        query = request["query"]
        assert query["access_token"] == ["tok123"]
        ts = query["timestamp"][0]
        assert abs(int(ts) - time.time() * 1000) < 3_600_000  # DingTalk rejects timestamps older than an hour
        expected = base64.b64encode(hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()).decode()
        assert query["sign"] == [expected]
        body = request["body"]
        assert body["msgtype"] == "markdown" and body["markdown"]["title"] == "flightlog nonfinite"
        assert "loss is nan" in body["markdown"]["text"]
        assert channel.sent == 1

    def test_dingtalk_error_code_is_a_failure(self, server: Recorder) -> None:
        """errcode 310000 (bad signature) counts as failed and is not retried."""
        errors: list[str] = []
        server.default = (200, b'{"errcode":310000,"errmsg":"sign not match"}')
        channel = Channel(make_notifier(parse_spec({"type": "dingtalk", "url": server.url + "/robot/send?access_token=t", "secret": "s",
                                                    "backoff": 0.01}, 0)), RUN, on_error=errors.append)
        channel.submit(ALERT)
        channel.close(10.0)
        assert channel.failed == 1 and channel.sent == 0 and len(server.requests) == 1
        assert "310000" in errors[0] and "tok" not in errors[0] and "robot/send" not in errors[0]

    def test_feishu_signature(self, server: Recorder) -> None:
        """Feishu: sign = base64(HMAC-SHA256(key=ts+'\\n'+secret, msg='')), timestamp in seconds, in the body."""
        secret = "feishu-secret"
        server.default = (200, b'{"code":0,"msg":"success"}')
        channel = deliver({"url": "http://127.0.0.1:%d/open-apis/bot/v2/hook/abc" % server.server_address[1], "type": "feishu",
                           "secret": secret})
        body = server.wait(1)[0]["body"]
        ts = body["timestamp"]
        expected = base64.b64encode(hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()).decode()
        assert body["sign"] == expected and abs(int(ts) - time.time()) < 3600
        assert body["msg_type"] == "text" and "nonfinite" in body["content"]["text"]
        assert channel.sent == 1

    def test_feishu_bad_signature_answer(self, server: Recorder) -> None:
        server.default = (200, b'{"code":19021,"msg":"sign match fail or timestamp is not within one hour from current time"}')
        channel = deliver({"type": "feishu", "url": server.url + "/hook", "secret": "x"})
        assert channel.failed == 1 and "19021" in (channel.last_error or "")

    def test_alertmanager_api_v2(self, server: Recorder) -> None:
        """Alertmanager /api/v2/alerts (kind guessed from the path): a list of postable alerts."""
        deliver({"url": server.url + "/api/v2/alerts"})
        request = server.wait(1)[0]
        assert request["path"] == "/api/v2/alerts"
        (alert,) = request["body"]
        assert alert["labels"] == {"alertname": "FlightlogNonfinite", "severity": "critical", "rule": "nonfinite",
                                   "source": "flightlog", "run": RUN["run_name"], "run_id": RUN["run_id"], "host": "node1"}
        assert alert["annotations"]["summary"] == "loss is nan" and alert["annotations"]["value"] == "nan"
        assert alert["startsAt"] == "2026-11-30T01:38:35.853Z" and alert["endsAt"] == "2026-11-30T02:38:35.853Z"

    def test_alertmanager_webhook_format(self, server: Recorder) -> None:
        """The JSON Alertmanager sends to webhook receivers (version 4)."""
        deliver({"type": "alertmanager_webhook", "url": server.url + "/hook"})
        body = server.wait(1)[0]["body"]
        assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "flightlog"
        assert body["groupLabels"] == {"alertname": "FlightlogNonfinite"}
        (item,) = body["alerts"]
        assert item["status"] == "firing" and item["labels"]["rule"] == "nonfinite" and len(item["fingerprint"]) == 16

    def test_generic_webhook(self, server: Recorder) -> None:
        """Generic JSON: the alert (NaN as the protocol string), the run and a text; extra headers are sent."""
        deliver({"url": server.url + "/flightlog", "headers": {"X-Token": "abc"}})
        request = server.wait(1)[0]
        assert request["headers"]["X-Token"] == "abc"
        body = request["body"]
        assert body["alert"]["value"] == "NaN" and body["alert"]["rule"] == "nonfinite" and body["run"] == RUN


class TestDelivery:
    def test_retry_with_backoff_on_5xx(self, server: Recorder) -> None:
        """Two 503s then 200: delivered on the third try."""
        server.responses = [(503, b"busy"), (503, b"busy")]
        channel = deliver({"url": server.url + "/x", "backoff": 0.01, "retries": 3})
        assert channel.sent == 1 and len(server.requests) == 3

    def test_client_error_is_not_retried(self, server: Recorder) -> None:
        server.default = (400, b"invalid_payload")
        channel = deliver({"type": "slack", "url": server.url + "/x", "backoff": 0.01})
        assert channel.failed == 1 and len(server.requests) == 1 and "invalid_payload" in (channel.last_error or "")

    def test_min_severity_and_bounded_queue(self, server: Recorder) -> None:
        """Warnings below min_severity are not sent; a full queue drops the oldest and counts it."""
        server.delay = 0.3
        spec = parse_spec({"url": server.url + "/x", "min_severity": "critical", "queue_size": 2}, 0)
        channel = Channel(make_notifier(spec), RUN)
        channel.submit({**ALERT, "severity": "warning"})
        for i in range(6):
            channel.submit({**ALERT, "step": i})
        channel.close(10.0)
        assert channel.dropped >= 3 and channel.sent + channel.dropped == 6
        assert all(r["body"]["alert"]["severity"] == "critical" for r in server.requests)

    def test_bad_specs_name_the_key(self) -> None:
        with pytest.raises(ConfigError, match=r"notify\[0\]\.url"):
            parse_spec({"url": "ftp://x"}, 0)
        with pytest.raises(ConfigError, match=r"notify\[1\]\.type"):
            parse_spec({"url": "http://x", "type": "pager"}, 1)
        with pytest.raises(ConfigError, match=r"unknown key notify\[0\]\.secrte"):
            parse_spec({"url": "http://x", "secrte": "s"}, 0)
        with pytest.raises(ConfigError, match="DING_SECRET"):
            parse_spec({"url": "https://oapi.dingtalk.com/robot/send", "secret_env": "DING_SECRET"}, 0, env={})
        assert parse_spec({"url": "https://oapi.dingtalk.com/robot/send", "secret_env": "S"}, 0, env={"S": "x"}).secret == "x"
        assert parse_spec("https://hooks.slack.com/services/T/B/C", 0).type == "slack"
        assert parse_spec("https://open.feishu.cn/open-apis/bot/v2/hook/x", 0).type == "feishu"

    def test_run_rejects_bad_notify(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"notify\[0\]\.timeout"):
            flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False,
                           notify=[{"url": "http://127.0.0.1:1/x", "timeout": -1}])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_endpoints_do_not_slow_training(tmp_path: Path, server: Recorder) -> None:
    """A refused port and a server that hangs for 5 s per request: the loop and finish() stay fast."""
    server.delay = 5.0
    notify = [{"url": f"http://127.0.0.1:{_free_port()}/dead", "retries": 2, "backoff": 0.2},
              {"url": server.url + "/hang", "timeout": 1.0, "retries": 2, "backoff": 0.2}]

    def loop(out: Path, with_notify: bool) -> tuple[float, float, Any]:
        run = flightlog.init(output_dir=out, sinks=["jsonl"], install_signal_handlers=False, flush_interval=0.05,
                             notify=notify if with_notify else [])
        start = time.perf_counter()
        for step in range(1, 3001):
            run.log({"loss": float("nan") if step % 100 == 0 else 2.0 - step * 1e-4, "grad_norm": 1.0}, step=step)
            if step % 500 == 0:
                time.sleep(0.1)  # the writer processes (and alerts) while the loop goes on
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        run.finish()
        return elapsed, time.perf_counter() - start, run

    quiet, _, _ = loop(tmp_path / "quiet", False)
    noisy, finish_s, run = loop(tmp_path / "noisy", True)
    alerts = [json.loads(line) for line in (run.log_dir / "train.jsonl").read_text().splitlines() if '"alert"' in line]
    assert len(alerts) >= 10  # one per NaN (re-armed after 20 clean records)
    assert run.rules.dispatcher.channels[0].failed >= 1  # the refused endpoint was really tried
    assert noisy < quiet + 1.0, f"loop took {noisy:.2f}s with dead notifiers vs {quiet:.2f}s without"
    assert finish_s < 5.0, f"finish waited {finish_s:.2f}s for dead notifiers"


def test_run_alerts_reach_notifiers(tmp_path: Path, server: Recorder) -> None:
    """Alerts from the rules and from user code (run.alert) are delivered, each once."""
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, flush_interval=0.05,
                         notify=[server.url + "/hook"])
    run.alert("eval_regression", "eval_accuracy fell 5 points", severity="critical", value=0.71, threshold=0.76)
    run.log({"loss": float("nan")}, step=1)
    run.finish()
    bodies = [r["body"]["alert"] for r in server.wait(2)]
    assert sorted(b["rule"] for b in bodies) == ["eval_regression", "nonfinite"]
    user = next(b for b in bodies if b["rule"] == "eval_regression")
    assert user["value"] == 0.71 and user["run_id"] == run.run_id
    time.sleep(0.2)
    assert len(server.requests) == 2
