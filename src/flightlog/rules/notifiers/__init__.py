"""Payload formats, one module per service (webhook, slack, dingtalk, feishu, alertmanager)."""
