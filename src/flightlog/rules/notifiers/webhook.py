"""Generic JSON webhook: the alert record, the run it belongs to, and a text line.

For any receiver that takes JSON (a chat-ops bot, a serverless function, n8n).
Body::

    {"source": "flightlog", "text": "...", "alert": {rule, severity, message, value, threshold, action, step, timestamp, ...},
     "run": {"run_id", "run_name", "host", "log_dir"}}
"""

from __future__ import annotations

from typing import Any, Mapping

from flightlog.rules.notify import Delivery, Notifier, alert_text, json_body


class WebhookNotifier(Notifier):
    kind = "webhook"

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        body = {"source": "flightlog", "text": alert_text(alert, run), "alert": dict(alert), "run": dict(run)}
        return Delivery(self.spec.url, json_body(body))
