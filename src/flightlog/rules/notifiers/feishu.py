"""Feishu / Lark custom bot (自定义机器人), with its signature check.

Signing, per Feishu's documentation: ``timestamp`` is the current time in seconds;
``string_to_sign = f"{timestamp}\\n{secret}"`` is used as the HMAC-SHA256 *key* over an
empty message, and ``sign = base64(digest)``; both go into the JSON body next to
``msg_type`` and ``content``. Feishu answers ``{"code": 0, "msg": "success"}`` (older
deployments ``{"StatusCode": 0}``); code 19021 means a bad signature, 19024 a bad keyword.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any, Mapping

from flightlog.rules.notify import Delivery, DeliveryError, Notifier, alert_text, json_body


def sign(secret: str, timestamp_s: int) -> str:
    string_to_sign = f"{timestamp_s}\n{secret}".encode("utf-8")
    return base64.b64encode(hmac.new(string_to_sign, b"", hashlib.sha256).digest()).decode("ascii")


class FeishuNotifier(Notifier):
    kind = "feishu"

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        body: dict[str, Any] = {"msg_type": "text", "content": {"text": alert_text(alert, run)}}
        if self.spec.secret:
            ts = int(time.time())
            body = {"timestamp": str(ts), "sign": sign(self.spec.secret, ts), **body}
        return Delivery(self.spec.url, json_body(body))

    def check(self, status: int, body: bytes) -> None:
        try:
            answer = json.loads(body or b"{}")
        except ValueError:
            raise DeliveryError(f"Feishu answered non-JSON: {body[:100]!r}", retry=True) from None
        code = answer.get("code", answer.get("StatusCode", 0))
        if code != 0:
            raise DeliveryError(f"Feishu code {code}: {answer.get('msg', answer.get('StatusMessage', ''))}", retry=code == 11232)
