"""Which reduction each metric gets across ranks.

A loss averaged over ranks is the number a user means; a memory figure is only
useful as the worst rank (max); a throughput is the whole job's (sum). The policy is
decided once per key and cached, so a logging step pays a dict lookup per metric.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Mapping

# Built-in rules, tried after the user's: (glob, op).
DEFAULT_RULES: tuple[tuple[str, str], ...] = (("*memory*", "max"), ("throughput_*", "sum"))
OPS = ("mean", "sum", "max", "min", "rank0")


class Policy:
    """``op(key)``: the user's exact names, then the user's globs in order, then the defaults, then mean.

    The weight metric (``dist_weight``), a per-rank sample or token count, is summed.
    """

    def __init__(self, overrides: Mapping[str, str] | None = None, weight: str | None = None) -> None:
        overrides = dict(overrides or {})
        for key, op in overrides.items():
            if op not in OPS:
                raise ValueError(f"flightlog: dist_policy[{key!r}]={op!r} is not one of {', '.join(OPS)}")
        self.weight = weight
        self._exact = {k: v for k, v in overrides.items() if not any(c in k for c in "*?[")}
        self._globs = [(k, v) for k, v in overrides.items() if k not in self._exact] + list(DEFAULT_RULES)
        self._cache: dict[str, str] = {}

    def op(self, key: str) -> str:
        try:
            return self._cache[key]
        except KeyError:
            pass
        op = self._exact.get(key)
        if op is None and key == self.weight:
            op = "sum"
        if op is None:
            op = next((o for pattern, o in self._globs if fnmatchcase(key, pattern)), "mean")
        self._cache[key] = op
        return op
