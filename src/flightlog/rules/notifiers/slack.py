"""Slack incoming webhook (https://api.slack.com/messaging/webhooks).

POST ``{"text": ..., "blocks": [...]}`` to the hook URL; ``text`` is the required
fallback (notifications, old clients), the blocks carry the same content in mrkdwn.
Slack answers ``200 ok``, or 4xx with a short reason (``invalid_payload``, ``no_service``).
"""

from __future__ import annotations

from typing import Any, Mapping

from flightlog.rules.notify import Delivery, Notifier, alert_text, json_body

_ICON = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def _escape(text: str) -> str:
    """Slack's three control characters in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackNotifier(Notifier):
    kind = "slack"

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        text = alert_text(alert, run)
        icon = _ICON.get(str(alert.get("severity")), ":warning:")
        head, _, rest = text.partition("\n")
        blocks = [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} *{_escape(head)}*"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _escape(rest) or " "}},
        ]
        return Delivery(self.spec.url, json_body({"text": text, "blocks": blocks}))
