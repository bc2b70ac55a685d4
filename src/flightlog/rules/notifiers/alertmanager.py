"""Alertmanager: push to its API, or speak its webhook format to a receiver that expects it.

``alertmanager``: POST a JSON list of postable alerts to ``http://AM:9093/api/v2/alerts``
(Alertmanager's own v2 API): ``labels`` (``alertname``, ``severity``, ``rule``, run labels),
``annotations`` (summary, action, value, threshold, step), ``startsAt`` and ``endsAt``
(``resolve_after`` later: an alert that is not repeated resolves by itself).

``alertmanager_webhook``: the JSON that Alertmanager sends to webhook receivers
(``version: "4"``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL``, ``alerts: [...]``), for tools written to consume it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from flightlog.promnames import alert_name
from flightlog.rules.notify import Delivery, Notifier, json_body


def _rfc3339(ts: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(timezone.utc)


def _fmt(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def labels_and_annotations(alert: Mapping[str, Any], run: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    rule = str(alert.get("rule", "alert"))
    labels = {"alertname": alert_name(rule), "severity": str(alert.get("severity", "warning")), "rule": rule,
              "source": "flightlog"}
    # The exporter's run labels (``run`` = run name, ``run_id``), so routes match both sources.
    for label, key in (("run", "run_name"), ("run_id", "run_id"), ("host", "host")):
        if run.get(key):
            labels[label] = str(run[key])
    annotations = {"summary": str(alert.get("message", ""))}
    for key in ("action", "value", "threshold", "step"):
        if alert.get(key) is not None:
            annotations[key] = str(alert[key])
    return labels, annotations


class AlertmanagerNotifier(Notifier):
    kind = "alertmanager"

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        labels, annotations = labels_and_annotations(alert, run)
        start = _rfc3339(alert.get("timestamp"))
        postable = {"labels": labels, "annotations": annotations, "startsAt": _fmt(start),
                    "endsAt": _fmt(start + timedelta(seconds=self.spec.resolve_after))}
        if run.get("log_dir"):
            postable["generatorURL"] = "file://" + str(run["log_dir"])
        return Delivery(self.spec.url, json_body([postable]))


class AlertmanagerWebhookNotifier(Notifier):
    kind = "alertmanager_webhook"

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        labels, annotations = labels_and_annotations(alert, run)
        fingerprint = hashlib.sha256("".join(f"{k}={v}" for k, v in sorted(labels.items())).encode()).hexdigest()[:16]
        item = {"status": "firing", "labels": labels, "annotations": annotations,
                "startsAt": _fmt(_rfc3339(alert.get("timestamp"))), "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "file://" + str(run.get("log_dir", "")), "fingerprint": fingerprint}
        body = {"version": "4", "groupKey": f'{{}}:{{alertname="{labels["alertname"]}"}}', "truncatedAlerts": 0,
                "status": "firing", "receiver": "flightlog", "groupLabels": {"alertname": labels["alertname"]},
                "commonLabels": labels, "commonAnnotations": annotations, "externalURL": "", "alerts": [item]}
        return Delivery(self.spec.url, json_body(body))
