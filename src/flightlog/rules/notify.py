"""Sending alerts out: one background thread per destination, never in the training's way.

``submit`` only appends to a bounded deque (the oldest alert is dropped and counted
when a destination cannot keep up). The channel's thread POSTs with a timeout and
retries with exponential back-off; a dead endpoint costs that thread time, never the
training loop's, and at the end of a run ``close`` waits at most ``close_timeout``.

Destinations are given as the run's ``notify`` setting: a URL (the kind is guessed
from the host: Slack, DingTalk, Feishu/Lark, Alertmanager's ``/api/v2/alerts``, else a
generic JSON webhook) or a mapping ``{type, url, secret, secret_env, min_severity,
timeout, retries, backoff, headers}``. The payload formats live in
:mod:`flightlog.rules.notifiers`, one module per service.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from flightlog.config import ConfigError
from flightlog.protocol import make_finite
from flightlog.rules.detectors import SEVERITIES

KINDS: dict[str, str] = {
    "webhook": "flightlog.rules.notifiers.webhook:WebhookNotifier",
    "slack": "flightlog.rules.notifiers.slack:SlackNotifier",
    "dingtalk": "flightlog.rules.notifiers.dingtalk:DingTalkNotifier",
    "feishu": "flightlog.rules.notifiers.feishu:FeishuNotifier",
    "lark": "flightlog.rules.notifiers.feishu:FeishuNotifier",
    "alertmanager": "flightlog.rules.notifiers.alertmanager:AlertmanagerNotifier",
    "alertmanager_webhook": "flightlog.rules.notifiers.alertmanager:AlertmanagerWebhookNotifier",
}
_SPEC_KEYS = {"type", "url", "secret", "secret_env", "min_severity", "timeout", "retries", "backoff", "headers",
              "queue_size", "resolve_after"}


class DeliveryError(Exception):
    """The destination refused or failed; ``retry`` says whether trying again may help."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass
class Delivery:
    """One HTTP POST: where, what, which headers."""

    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


@dataclass(kw_only=True)
class NotifierSpec:
    type: str
    url: str
    secret: str | None = None
    min_severity: str = "warning"
    timeout: float = 5.0
    retries: int = 3
    backoff: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)
    queue_size: int = 100
    resolve_after: float = 3600.0


def public_url(url: str) -> str:
    """The URL without path/query (they hold tokens): safe to print."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/..."


def alert_text(alert: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """The human text of an alert, shared by the chat notifiers."""
    severity = str(alert.get("severity", "warning")).upper()
    step = alert.get("step")
    where = f" at step {step}" if step is not None else ""
    lines = [f"[flightlog] {severity} {alert.get('rule', '?')} in run {run.get('run_name', '?')} ({run.get('run_id', '?')}){where}",
             str(alert.get("message", ""))]
    detail = [f"{k}={alert[k]}" for k in ("value", "threshold") if k in alert]
    if detail:
        lines.append(", ".join(detail))
    if alert.get("action"):
        lines.append(f"Action: {alert['action']}")
    if run.get("host"):
        lines.append(f"Host: {run['host']}  Logs: {run.get('log_dir', '?')}")
    return "\n".join(lines)


class Notifier:
    """Base for the payload formats: ``build`` a delivery, ``check`` the answer."""

    kind = "webhook"

    def __init__(self, spec: NotifierSpec) -> None:
        self.spec = spec

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        raise NotImplementedError

    def check(self, status: int, body: bytes) -> None:
        """Raise DeliveryError when the service says the message was not accepted."""


def infer_kind(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if host.endswith("hooks.slack.com"):
        return "slack"
    if host.endswith("dingtalk.com"):
        return "dingtalk"
    if host.endswith("feishu.cn") or host.endswith("larksuite.com"):
        return "feishu"
    if parts.path.rstrip("/").endswith("/api/v2/alerts"):
        return "alertmanager"
    return "webhook"


def parse_spec(raw: Any, index: int, env: Mapping[str, str] | None = None) -> NotifierSpec:
    """A validated spec from a URL or a mapping; errors name ``notify[i].key``."""
    env = os.environ if env is None else env
    where = f"notify[{index}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"flightlog config: {where}={raw!r} is not allowed; expected a URL or a mapping with 'url'")
    for key in raw:
        if key not in _SPEC_KEYS:
            raise ConfigError(f"flightlog config: unknown key {where}.{key}; known: {', '.join(sorted(_SPEC_KEYS))}")
    url = raw.get("url")
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ConfigError(f"flightlog config: {where}.url={url!r} is not allowed; expected an http(s) URL")
    kind = raw.get("type") or infer_kind(url)
    if kind not in KINDS:
        raise ConfigError(f"flightlog config: {where}.type={kind!r} is not allowed; expected one of {', '.join(KINDS)}")
    secret = raw.get("secret")
    if raw.get("secret_env"):
        secret = env.get(str(raw["secret_env"]))
        if not secret:
            raise ConfigError(f"flightlog config: {where}.secret_env names {raw['secret_env']!r}, which is not set")
    spec = NotifierSpec(type=kind, url=url, secret=secret)
    for key, check, expected in (
        ("min_severity", lambda v: v in SEVERITIES, "one of " + ", ".join(SEVERITIES)),
        ("timeout", lambda v: type(v) in (int, float) and 0 < v <= 300, "seconds > 0 and <= 300"),
        ("retries", lambda v: type(v) is int and 0 <= v <= 20, "an integer from 0 to 20"),
        ("backoff", lambda v: type(v) in (int, float) and 0 <= v <= 600, "seconds >= 0"),
        ("headers", lambda v: isinstance(v, Mapping) and all(isinstance(x, str) for x in v.values()), "a mapping of strings"),
        ("queue_size", lambda v: type(v) is int and v >= 1, "an integer >= 1"),
        ("resolve_after", lambda v: type(v) in (int, float) and v > 0, "seconds > 0"),
    ):
        if key in raw:
            if not check(raw[key]):
                raise ConfigError(f"flightlog config: {where}.{key}={raw[key]!r} is not allowed; expected {expected}")
            setattr(spec, key, dict(raw[key]) if key == "headers" else raw[key])
    if kind in ("dingtalk", "feishu", "lark") and secret is not None and not isinstance(secret, str):
        raise ConfigError(f"flightlog config: {where}.secret must be a string")
    return spec


def make_notifier(spec: NotifierSpec) -> Notifier:
    module, _, name = KINDS[spec.type].partition(":")
    return getattr(importlib.import_module(module), name)(spec)  # type: ignore[no-any-return]


def post(delivery: Delivery, timeout: float) -> tuple[int, bytes]:
    """POST and return (status, body); HTTP errors are answers too, network errors raise."""
    request = urllib.request.Request(delivery.url, data=delivery.body, headers=delivery.headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http(s) checked)
            return response.status, response.read(65536)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(65536) if exc.fp else b""


class Channel:
    """One destination: a bounded queue and the thread that delivers from it."""

    def __init__(self, notifier: Notifier, run: Mapping[str, Any],
                 on_error: Callable[[str], None] | None = None, sleep: Callable[[float], Any] | None = None) -> None:
        self.notifier = notifier
        self.spec = notifier.spec
        self.run = dict(run)
        self.on_error = on_error
        self.sent = self.failed = self.dropped = 0
        self.last_error: str | None = None
        self._queue: deque[dict[str, Any]] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"flightlog-notify-{self.spec.type}", daemon=True)
        self._thread.start()

    def submit(self, alert: Mapping[str, Any]) -> None:
        """Queue an alert (never blocks). Alerts below ``min_severity`` are ignored."""
        rank = SEVERITIES.index(str(alert.get("severity", "warning"))) if alert.get("severity") in SEVERITIES else 1
        if rank < SEVERITIES.index(self.spec.min_severity):
            return
        with self._lock:
            if len(self._queue) >= self.spec.queue_size:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(dict(alert))
            self._idle.clear()
        self._wake.set()

    def close(self, timeout: float = 2.0) -> bool:
        """Wait up to ``timeout`` for queued alerts to go out, then stop; True if all went."""
        done = self._idle.wait(timeout)
        self._stop.set()
        self._wake.set()
        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                with self._lock:
                    if not self._queue:
                        self._idle.set()
                        break
                    alert = self._queue.popleft()
                self._deliver(alert)

    def _deliver(self, alert: dict[str, Any]) -> None:
        spec = self.spec
        error = ""
        for attempt in range(spec.retries + 1):
            if attempt:
                if self._stop.wait(min(spec.backoff * 2 ** (attempt - 1), 60.0)):
                    break
            try:
                delivery = self.notifier.build(alert, self.run)
                delivery.headers.update(spec.headers)
                status, body = post(delivery, spec.timeout)
                if status == 429 or status >= 500:
                    raise DeliveryError(f"HTTP {status}", retry=True)
                if status >= 400:
                    raise DeliveryError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}", retry=False)
                self.notifier.check(status, body)
                self.sent += 1
                return
            except DeliveryError as exc:
                error = str(exc)
                if not exc.retry:
                    break
            except (OSError, ValueError) as exc:  # refused, timeout, DNS, bad URL
                error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a bug in a payload builder must not kill the thread
                error = f"{type(exc).__name__}: {exc}"
                break
        self.failed += 1
        self.last_error = error
        if self.on_error is not None:
            try:
                self.on_error(f"notifier {spec.type} ({public_url(spec.url)}) could not deliver alert "
                              f"{alert.get('rule', '?')}: {error}")
            except Exception:
                pass


class Dispatcher:
    """Fans an alert out to every channel; what the rules engine calls ``on_alert``."""

    def __init__(self, specs: list[NotifierSpec], run: Mapping[str, Any],
                 on_error: Callable[[str], None] | None = None) -> None:
        run = dict(run)
        self.channels = [Channel(make_notifier(s), run, on_error) for s in specs]

    def __call__(self, alert: Mapping[str, Any]) -> None:
        alert = dict(alert)
        alert.setdefault("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()))
        for channel in self.channels:
            channel.submit(alert)

    def close(self, timeout: float = 2.0) -> bool:
        deadline = time.monotonic() + timeout
        ok = True
        for channel in self.channels:
            ok = channel.close(max(0.0, deadline - time.monotonic())) and ok
        return ok


def json_body(obj: Any) -> bytes:
    """UTF-8 strict JSON (NaN/Inf values become the protocol's strings)."""
    return json.dumps(make_finite(obj), ensure_ascii=False, allow_nan=False, default=str).encode("utf-8")
