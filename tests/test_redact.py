"""Redaction: secrets never reach a sink or run.json."""

from __future__ import annotations

import pytest

from flightlog.redact import MASK, Redactor, hash_value, is_secret_key, redact_text
from flightlog.runfile import read_run_file
from tests.conftest import read_stream

SECRETS = [
    ("openai key", "using sk-proj-abcdEFGH1234ijklMNOP5678 for eval", "sk-proj-abcdEFGH1234ijklMNOP5678"),
    ("anthropic key", "key sk-ant-api03-abcdefghijklmnopqrstuvwx", "sk-ant-api03-abcdefghijklmnopqrstuvwx"),
    ("hf token", "HF_TOKEN is hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"),
    ("aws access key", "creds AKIAIOSFODNN7EXAMPLE loaded", "AKIAIOSFODNN7EXAMPLE"),
    ("github token", "ghp_0123456789abcdefghijklmnopqrstuvwxyz", "ghp_0123456789abcdefghijklmnopqrstuvwxyz"),
    ("bearer", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9.payload.sig"),
    ("password=", "connecting with password=hunter2secret", "hunter2secret"),
    ("token=", "https://hooks.example/x?token=abc123def456&x=1", "abc123def456"),
    ("api_key:", 'config {"api_key": "zzz-secret-value"}', "zzz-secret-value"),
    ("url credentials", "postgres://admin:s3cr3tpass@db.local/runs", "s3cr3tpass"),
]


class TestPatterns:
    @pytest.mark.parametrize("name,text,secret", SECRETS, ids=[s[0] for s in SECRETS])
    def test_each_secret_pattern_is_masked(self, name, text, secret):
        """Each kind of secret disappears from free text and is replaced by the mask."""
        out = redact_text(text)
        assert secret not in out and MASK in out

    def test_ordinary_text_untouched(self):
        """Training messages with numbers and paths are left alone."""
        text = "Step 45/500 | loss 2.1423 | tokens_per_sec 3200 | saved output/checkpoint-400"
        assert redact_text(text) == text

    def test_secret_keys(self):
        """Key names decide: secrets masked, token counts kept."""
        assert is_secret_key("api_key") and is_secret_key("WANDB_API_KEY") and is_secret_key("db_password")
        assert is_secret_key("hub_token") and is_secret_key("slack_webhook_url")
        assert not is_secret_key("throughput_tokens_per_sec") and not is_secret_key("max_tokens")
        assert not is_secret_key("pad_token_id") and not is_secret_key("learning_rate")

    def test_nested_config(self):
        """Secret-named keys are masked at any depth; other values are scanned as text."""
        r = Redactor()
        out = r.redact_nested({"hub_token": "abc", "opt": {"lr": 1e-4, "aws_secret_access_key": "xyz"}, "cmd": ["--password=pw123456"]})
        assert out == {"hub_token": MASK, "opt": {"lr": 1e-4, "aws_secret_access_key": MASK}, "cmd": [f"--password={MASK}"]}

    def test_drop_and_hash_fields(self):
        """User-named fields are dropped or replaced by a stable hash."""
        r = Redactor(drop=["prompt"], hash_fields=["file_path"])
        out = r({"type": "event", "prompt": "secret user text", "file_path": "/data/x.json", "message": "ok"})
        assert "prompt" not in out and out["file_path"] == hash_value("/data/x.json") and out["file_path"].startswith("sha256:")
        assert hash_value("/data/x.json") == hash_value("/data/x.json") != hash_value("/data/y.json")


class TestEndToEnd:
    def test_nothing_secret_on_disk(self, make_run, console):
        """Config, events, metric strings and run.json are all redacted before any sink."""
        run = make_run(
            config={"openai_api_key": "sk-abcdefghijklmnopqrstuvwx", "lr": 1e-4, "report_to": "wandb"},
            redact_drop=["prompt"],
            redact_hash=["sample_path"],
        )
        run.event("logged in with hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123")
        run.log({"loss": 1.0, "prompt": "tell me a secret", "sample_path": "/home/u/data.json", "note": "password=abcdefgh1"}, step=1)
        run.finish()
        raw = (run.log_dir / "train.jsonl").read_text() + (run.log_dir / "run.json").read_text() + console.getvalue()
        for secret in ("sk-abcdefghijklmnopqrstuvwx", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "tell me a secret", "/home/u/data.json", "abcdefgh1"):
            assert secret not in raw
        assert read_run_file(run.log_dir)["config"]["openai_api_key"] == MASK
        metrics = [r for r in read_stream(run.log_dir / "train.jsonl") if r["type"] == "metrics"][0]
        assert metrics["sample_path"].startswith("sha256:") and "prompt" not in metrics

    def test_redaction_can_be_turned_off(self, make_run):
        """redact=False writes values as given (for private, trusted setups)."""
        run = make_run(redact=False, config={"api_key": "visible-key-123"})
        run.finish()
        assert read_run_file(run.log_dir)["config"]["api_key"] == "visible-key-123"
