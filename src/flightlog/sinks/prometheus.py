"""The prometheus sink: a ``/metrics`` endpoint that Prometheus scrapes while the run lives.

Exposed families (all labelled ``run`` = run name and ``run_id``):

* ``flightlog_<metric>`` (gauge): the last value of every numeric metric, one family a
  metric (``flightlog_loss``, ``flightlog_eval_loss``, ``flightlog_grad_norm`` ...), so
  PromQL and alert rules read naturally. Names are sanitised to Prometheus' alphabet;
  NaN stays NaN. Metric names that would shadow the families below are skipped.
* ``flightlog_last_step`` and ``flightlog_last_step_timestamp_seconds`` (gauges): the
  latest step and when it was logged; ``time() - flightlog_last_step_timestamp_seconds
  > 600`` is a stall alert.
* ``flightlog_records_total{type=...}`` and ``flightlog_alerts_total{rule,severity}``
  (counters) and ``flightlog_run_info{task_type,model_name}`` (always 1).

Safe by default: it binds ``127.0.0.1``. Binding any other address needs a token
(``prometheus_token`` or ``FLIGHTLOG_TOKEN``); when a token is set every scrape must
send ``Authorization: Bearer TOKEN`` (Prometheus: ``authorization: {credentials: ...}``).
A port that is taken fails ``flightlog.init`` with an error naming the port, before any
training time is spent. The bound address is also written as a Prometheus file-based
service-discovery target, ``LOG_DIR/prometheus_targets.json``, so ``prometheus_port=0``
(any free port) stays scrapable. Uses its own ``CollectorRegistry``, never the global one.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import orjson

from flightlog.config import ConfigError
from flightlog.protocol import ALERT, METRICS, RUN_START
from flightlog.runfile import write_atomic
from flightlog.sinks._optional import require
from flightlog.sinks._scalars import record_time, scalar_fields
from flightlog.sinks.base import BaseSink, Record

PREFIX = "flightlog_"
TARGETS_FILE = "prometheus_targets.json"
RESERVED = frozenset({
    "last_step", "last_step_timestamp_seconds", "records", "records_total", "records_created",
    "alerts", "alerts_total", "alerts_created", "run_info", "run",
})
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(name: str) -> str | None:
    """``flightlog_<name>`` in Prometheus' alphabet, or None for a reserved name."""
    clean = _INVALID.sub("_", name)
    if clean in RESERVED:
        return None
    return PREFIX + clean


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _State:
    """What the endpoint shows; written by the writer thread, read by scrapes, under one lock."""

    def __init__(self, run: str, run_id: str) -> None:
        self.lock = threading.Lock()
        self.run, self.run_id = run, run_id
        self.task_type = self.model_name = ""
        self.values: dict[str, tuple[str, float]] = {}  # family -> (metric name, value)
        self.last_step: int | None = None
        self.last_step_time: float | None = None
        self.records: dict[str, int] = {}
        self.alerts: dict[tuple[str, str], int] = {}


class _Collector:
    """Yields families from a snapshot taken under the lock; formatting happens outside it."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.state
        with s.lock:
            run = [s.run, s.run_id]
            values = dict(s.values)
            last_step, last_time = s.last_step, s.last_step_time
            records, alerts = dict(s.records), dict(s.alerts)
            info = [s.task_type, s.model_name]
        labels = ["run", "run_id"]
        family = GaugeMetricFamily("flightlog_run_info", "The run being recorded (always 1).", labels=labels + ["task_type", "model_name"])
        family.add_metric(run + info, 1.0)
        yield family
        for fam, (name, value) in sorted(values.items()):
            family = GaugeMetricFamily(fam, f"Last logged value of metric {name!r}.", labels=labels)
            family.add_metric(run, value)
            yield family
        if last_step is not None:
            family = GaugeMetricFamily("flightlog_last_step", "Latest optimizer step logged.", labels=labels)
            family.add_metric(run, float(last_step))
            yield family
            family = GaugeMetricFamily(
                "flightlog_last_step_timestamp_seconds", "When the latest step was logged (Unix seconds); alert on time() minus this.", labels=labels
            )
            family.add_metric(run, float(last_time or 0.0))
            yield family
        family = CounterMetricFamily("flightlog_records", "Records written by this process, by type.", labels=labels + ["type"])
        for kind, count in sorted(records.items()):
            family.add_metric(run + [kind], float(count))
        yield family
        family = CounterMetricFamily("flightlog_alerts", "Alerts raised by this process, by rule and severity.", labels=labels + ["rule", "severity"])
        for (rule, severity), count in sorted(alerts.items()):
            family.add_metric(run + [rule, severity], float(count))
        yield family


def _handler(registry: Any, token: str | None) -> type[BaseHTTPRequestHandler]:
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

    expected = f"Bearer {token}".encode() if token else None

    class MetricsHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self._reply(404, b"not found; metrics are at /metrics\n")
                return
            if expected is not None:
                given = self.headers.get("Authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    self._reply(401, b"missing or wrong bearer token\n", {"WWW-Authenticate": "Bearer"})
                    return
            self._reply(200, generate_latest(registry), {"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

        def _reply(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for key, value in (headers or {"Content-Type": "text/plain; charset=utf-8"}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            pass

    return MetricsHandler


class PrometheusSink(BaseSink):
    """Serves ``/metrics`` from a daemon thread; ``write`` only updates numbers under a lock."""

    name = "prometheus"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 9464,
        token: str | None = None,
        run_name: str = "",
        run_id: str = "",
        targets_file: str | os.PathLike[str] | None = None,
    ) -> None:
        require("prometheus_client", "prometheus", "prometheus")
        from prometheus_client import CollectorRegistry

        if not is_loopback(host) and not token:
            raise ConfigError(
                f"flightlog config: prometheus_host={host!r} exposes /metrics beyond this machine, which needs a token; "
                "set FLIGHTLOG_TOKEN or prometheus_token (scrapers then send 'Authorization: Bearer TOKEN'), "
                "or keep the default prometheus_host='127.0.0.1'"
            )
        self.state = _State(run_name, run_id)
        self._families: dict[str, str | None] = {}  # metric name -> family, computed once
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self.state))  # type: ignore[arg-type]
        server_class = ThreadingHTTPServer
        if ":" in host.strip("[]"):
            server_class = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        try:
            self._server = server_class((host.strip("[]"), port), _handler(self.registry, token))
        except OSError as exc:
            reason = "is already in use (another run or exporter holds it)" if exc.errno in (98, 48) else f"cannot be bound ({exc.strerror or exc})"
            raise ConfigError(
                f"flightlog config: prometheus_port={port}: {host}:{port} {reason}; "
                "choose a free prometheus_port, or 0 for any free port"
            ) from None
        self.host = host
        self.port: int = self._server.server_address[1]
        self.url = f"http://{host if ':' not in host else '[' + host.strip('[]') + ']'}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.25}, name="flightlog-prometheus", daemon=True)
        self._thread.start()
        self.targets_file = Path(targets_file) if targets_file else None
        self._write_targets()

    def _write_targets(self) -> None:
        """File-based service discovery: ``file_sd_configs: [{files: [.../prometheus_targets.json]}]``."""
        if self.targets_file is None:
            return
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        target = f"[{host.strip('[]')}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        with self.state.lock:
            labels = {"run": self.state.run, "run_id": self.state.run_id}
        write_atomic(self.targets_file, orjson.dumps([{"targets": [target], "labels": labels}]), fsync=False)

    def write(self, batch: list[Record]) -> None:
        s = self.state
        renamed = False
        with s.lock:
            for record in batch:
                kind = str(record.get("type"))
                s.records[kind] = s.records.get(kind, 0) + 1
                if kind == METRICS:
                    families = self._families
                    for name, value in scalar_fields(record):
                        fam = families.get(name, "")
                        if fam == "":
                            fam = families[name] = metric_name(name)
                        if fam is not None:
                            s.values[fam] = (name, value)
                    step = record.get("step")
                    if type(step) is int:
                        s.last_step, s.last_step_time = step, record_time(record)
                elif kind == ALERT:
                    key = (str(record.get("rule", "")), str(record.get("severity", "")))
                    s.alerts[key] = s.alerts.get(key, 0) + 1
                elif kind == RUN_START:
                    name = record.get("run_name") or s.run
                    renamed = renamed or name != s.run or record.get("run_id", s.run_id) != s.run_id
                    s.run, s.run_id = str(name), str(record.get("run_id") or s.run_id)
                    s.task_type = str(record.get("task_type") or "")
                    s.model_name = str(record.get("model_name") or "")
        if renamed:
            self._write_targets()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
        if self.targets_file is not None:
            try:
                self.targets_file.unlink()  # the endpoint is gone; discovery should say so
            except OSError:
                pass


def from_config(config: Any, run_dir: Path) -> PrometheusSink:
    token = config.prometheus_token or os.environ.get("FLIGHTLOG_TOKEN") or None
    return PrometheusSink(
        host=config.prometheus_host,
        port=config.prometheus_port,
        token=token,
        run_name=config.run_name or Path(config.output_dir).resolve().name,
        run_id=config.run_id or "",
        targets_file=Path(run_dir) / TARGETS_FILE,
    )
