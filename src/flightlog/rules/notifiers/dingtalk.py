"""DingTalk custom robot (钉钉自定义机器人), with the "加签" HMAC-SHA256 signature.

Signing, per DingTalk's documentation: ``timestamp`` is the current time in
milliseconds; ``string_to_sign = f"{timestamp}\\n{secret}"``; ``sign`` is
``urlencode(base64(hmac_sha256(key=secret, msg=string_to_sign)))``; both are appended
to the webhook URL as query parameters. The body is a ``markdown`` message. DingTalk
answers HTTP 200 with ``{"errcode": 0, "errmsg": "ok"}``; any other errcode is a failure
(310000: bad signature or keyword; 130101: sending too fast, worth a retry).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.parse
from typing import Any, Mapping

from flightlog.rules.notify import Delivery, DeliveryError, Notifier, alert_text, json_body


def sign(secret: str, timestamp_ms: int) -> str:
    """The URL-encoded signature for ``timestamp_ms``."""
    string_to_sign = f"{timestamp_ms}\n{secret}".encode("utf-8")
    digest = hmac.new(secret.encode("utf-8"), string_to_sign, hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest))


class DingTalkNotifier(Notifier):
    kind = "dingtalk"

    def build(self, alert: Mapping[str, Any], run: Mapping[str, Any]) -> Delivery:
        url = self.spec.url
        if self.spec.secret:
            ts = int(time.time() * 1000)
            url += ("&" if "?" in url else "?") + f"timestamp={ts}&sign={sign(self.spec.secret, ts)}"
        head, _, rest = alert_text(alert, run).partition("\n")
        markdown = f"### {head}\n\n" + "\n\n".join(line for line in rest.splitlines() if line)
        body = {"msgtype": "markdown", "markdown": {"title": f"flightlog {alert.get('rule', 'alert')}", "text": markdown}}
        return Delivery(url, json_body(body))

    def check(self, status: int, body: bytes) -> None:
        try:
            answer = json.loads(body or b"{}")
        except ValueError:
            raise DeliveryError(f"DingTalk answered non-JSON: {body[:100]!r}", retry=True) from None
        code = answer.get("errcode", 0)
        if code != 0:
            raise DeliveryError(f"DingTalk errcode {code}: {answer.get('errmsg', '')}", retry=code == 130101)
