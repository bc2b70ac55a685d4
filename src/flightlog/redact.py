"""Redaction: secrets never reach a sink.

Runs on the writer thread before any sink, and on metadata before ``run.json`` is
written. Masks API keys (OpenAI-style ``sk-``, Hugging Face ``hf_``, AWS access key
ids), bearer tokens, ``password=``/``token=``-style assignments inside strings, and the
values of keys whose name says they hold a secret. Users can name extra fields whose
values are dropped (prompts) or replaced by a stable hash (file paths).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable

MASK = "[REDACTED]"

# Values that look like secrets wherever they appear in a string.
_TOKEN_PATTERNS = [
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"),  # OpenAI / Anthropic style keys
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face tokens
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),  # AWS access key ids
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),  # GitHub tokens
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack tokens
]
_BEARER = re.compile(r"(?i)\b(bearer|token|basic)(\s+)[A-Za-z0-9._~+/\-]{8,}=*")
# key=value / key: value / "key": "value" assignments whose key names a secret.
_ASSIGNMENT = re.compile(
    r"""(?ix)
    \b([a-z0-9_\-]*(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|credential)s?)
    (["']?\s*[:=]\s*["']?)
    ([^\s"'&,;]+)
    """
)
# URL credentials: scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@]+:)([^\s@/]+)(@)")

_SECRET_KEY = re.compile(
    r"(?i)(password|passwd|^pwd$|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|credential|authorization|auth[_-]?header|webhook[_-]?url|cookie)"
)
# Keys that contain "token" but count tokens rather than hold one.
_COUNT_KEY = re.compile(r"(?i)(tokens?_per|num_tokens|n_tokens|_tokens$|^tokens$|token_count|max_tokens|tokens_seen|token_id|pad_token|eos_token|bos_token|unk_token|tokenizer)")


def is_secret_key(key: str) -> bool:
    """Whether a field name says its value is a secret."""
    return bool(_SECRET_KEY.search(key)) and not _COUNT_KEY.search(key)


def redact_text(text: str) -> str:
    """Mask every secret-looking substring of ``text``."""
    if len(text) < 8:
        return text
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(MASK, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{MASK}{m.group(3)}", text)
    return text


def hash_value(value: Any) -> str:
    """A stable, non-reversible stand-in that still lets equal values be matched."""
    return "sha256:" + hashlib.sha256(str(value).encode("utf-8", "surrogatepass")).hexdigest()[:16]


# Fields flightlog itself writes; never secrets, and scanning them on every record is waste.
_OWN_FIELDS = frozenset({"type", "timestamp", "run_id", "step", "epoch", "level", "source", "stage", "precision"})


class Redactor:
    """The redaction processor: ``record -> record``, applied in place.

    Metrics records are mostly numbers, so the common path is one type check per value;
    text is only scanned for string values, and key verdicts are cached.
    """

    def __init__(self, drop: Iterable[str] = (), hash_fields: Iterable[str] = ()) -> None:
        self.drop = frozenset(drop)
        self.hash_fields = frozenset(hash_fields)
        self._special = self.drop | self.hash_fields
        self._secret_keys: dict[str, bool] = {}

    def _is_secret(self, key: str) -> bool:
        verdict = self._secret_keys.get(key)
        if verdict is None:
            verdict = is_secret_key(key)
            if len(self._secret_keys) < 10_000:  # bounded: keys can be user-made
                self._secret_keys[key] = verdict
        return verdict

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        special = self._special
        doomed = None
        for key, value in record.items():
            kind = type(value)
            if kind is float or kind is int or kind is bool or value is None:
                if special and key in special:
                    doomed = self._special_field(record, key, value, doomed)
                continue
            if key in _OWN_FIELDS:
                continue
            if special and key in special:
                doomed = self._special_field(record, key, value, doomed)
            elif kind is str:
                if self._is_secret(key):
                    record[key] = MASK
                elif len(value) >= 8:
                    record[key] = redact_text(value)
            elif kind is dict or kind is list:
                record[key] = self.redact_nested(value, key)
        if doomed:
            for key in doomed:
                del record[key]
        return record

    def leaves_alone(self, text_keys: set[Any], keys: Iterable[Any]) -> bool:
        """Whether records holding strings only under ``text_keys`` (and any value under
        ``keys``) pass ``__call__`` unchanged whatever the strings say: flightlog's own
        fields (``stage``, ``precision``...) are never scanned, and no key is one to drop
        or hash."""
        return _OWN_FIELDS.issuperset(text_keys) and (not self._special or self._special.isdisjoint(keys))

    def _special_field(self, record: dict[str, Any], key: str, value: Any, doomed: list[str] | None) -> list[str] | None:
        if key in self.drop:
            return (doomed or []) + [key]
        record[key] = hash_value(value)
        return doomed

    def redact_nested(self, value: Any, key: str = "") -> Any:
        """Redact a value found under ``key`` (config dicts, lists of strings...)."""
        if type(value) is dict:
            out = {}
            for k, v in value.items():
                ks = str(k)
                if ks in self.drop:
                    continue
                if ks in self.hash_fields:
                    out[k] = hash_value(v)
                elif is_secret_key(ks) and v not in (None, "", False):
                    out[k] = MASK if not isinstance(v, (dict, list)) else self.redact_nested(v, ks)
                else:
                    out[k] = self.redact_nested(v, ks)
            return out
        if type(value) is list or type(value) is tuple:
            return [self.redact_nested(v, key) for v in value]
        if type(value) is str:
            return redact_text(value)
        return value
