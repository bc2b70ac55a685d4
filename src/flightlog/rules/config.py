"""Rule thresholds from YAML: one dataclass per detector, validated with the key's name.

The run's ``rules`` setting is ``true`` (defaults), ``false`` (off), a path to a YAML
file, or a mapping. The file is flat: engine settings at the top, then one section per
rule, each overriding only what it names::

    warmup_steps: 100        # also: records with stage == "warmup", or a rising lr
    rearm_after: 20          # clean records before a rule may alert again
    on_critical: stop        # ask the training to stop gracefully (run.should_stop)
    loss_spike: {sigmas: 6, jump: 1.0}
    grad_explosion: {threshold: 10}
    slow_step: {enabled: false}
    stall: {factor: 10, min_seconds: 60}
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from flightlog.config import ConfigError, load_yaml_mapping
from flightlog.rules.detectors import DETECTORS, SEVERITIES, DetectorConfig

ON_CRITICAL = ("continue", "stop")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(kw_only=True)
class StallConfig:
    enabled: bool = True
    severity: str = "critical"
    factor: float = 10.0
    """Alert when no new step arrived for ``factor`` x the median time between steps ..."""
    min_seconds: float = 120.0
    """... but never sooner than this (a fast loop pauses for evals and checkpoints) ..."""
    pause_factor: float = 1.5
    """... nor sooner than this times the longest pause the run already came back from
    (periodic checkpoint saves and evaluations are learnt, not alarmed on twice)."""
    check_interval: float = 1.0
    """How often the timer thread looks."""
    window: int = 50
    min_intervals: int = 3
    """Intervals to see before the median is trusted."""


@dataclass(kw_only=True)
class RulesConfig:
    enabled: bool = True
    warmup_steps: int = 0
    """Steps up to this one count as warmup (besides ``stage == "warmup"`` and a rising lr)."""
    detect_warmup_from_lr: bool = True
    """Without a ``stage`` field, a learning rate that rises from the start is warmup."""
    rearm_after: int = 20
    """A rule that alerted stays quiet until this many records pass without its condition."""
    on_critical: str = "continue"
    """``stop``: a critical alert sets ``run.should_stop`` so the loop can save and exit."""
    detectors: dict[str, DetectorConfig] = field(default_factory=dict)
    stall: StallConfig = field(default_factory=StallConfig)

    def __post_init__(self) -> None:
        for name, cls in DETECTORS.items():
            self.detectors.setdefault(name, cls.Config())


_ENGINE_KEYS = {f.name for f in dataclasses.fields(RulesConfig)} - {"detectors", "stall", "enabled"}


def _fail(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"flightlog rules config: {key}={value!r} is not allowed; expected {expected}")


def _unknown(key: str, known: Any) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"flightlog rules config: unknown key {key!r}{hint} Known: {', '.join(sorted(known))}")


def _check(key: str, name: str, value: Any, default: Any) -> Any:
    """Validate ``value`` against the type of the field's default; returns the value to store."""
    if name == "severity":
        if value not in SEVERITIES:
            raise _fail(key, value, "one of " + ", ".join(SEVERITIES))
        return value
    if name == "on_critical":
        if value not in ON_CRITICAL:
            raise _fail(key, value, "one of " + ", ".join(ON_CRITICAL))
        return value
    if type(default) is bool:
        if type(value) is not bool:
            raise _fail(key, value, "true or false")
        return value
    if type(default) is int:
        low = 0 if name == "warmup_steps" else 1
        if type(value) is not int or value < low:
            raise _fail(key, value, f"an integer >= {low}")
        return value
    if type(default) is float:
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise _fail(key, value, "a number >= 0")
        return float(value)
    if type(default) is str:
        if not isinstance(value, str) or not value:
            raise _fail(key, value, "a metric name")
        return value
    if type(default) is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(key, value, "a list of metric names")
        return tuple(value)
    raise _fail(key, value, f"a {type(default).__name__}")


def _apply(target: Any, section: Mapping[str, Any], prefix: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    for name, value in section.items():
        key = f"{prefix}{name}"
        if name not in fields:
            raise _unknown(key, fields)
        setattr(target, name, _check(key, name, value, getattr(target, name)))


def from_mapping(data: Mapping[str, Any], source: str = "rules") -> RulesConfig:
    """A validated RulesConfig from a mapping (YAML content); errors name the key."""
    if isinstance(data.get("rules"), Mapping) and len(data) == 1:
        data = data["rules"]
    config = RulesConfig()
    known = _ENGINE_KEYS | set(DETECTORS) | {"stall"}
    for name, value in data.items():
        name = str(name)
        if name in _ENGINE_KEYS:
            setattr(config, name, _check(f"{source}.{name}", name, value, getattr(config, name)))
        elif name in DETECTORS or name == "stall":
            if value is False:
                value = {"enabled": False}
            if not isinstance(value, Mapping):
                raise _fail(f"{source}.{name}", value, "a mapping of thresholds (or false)")
            target = config.stall if name == "stall" else config.detectors[name]
            _apply(target, value, f"{source}.{name}.")
        else:
            raise _unknown(f"{source}.{name}", known)
    return config


def load(spec: Any) -> RulesConfig:
    """Interpret the run's ``rules`` setting: true/false, a YAML path, or a mapping."""
    if isinstance(spec, str) and spec.strip().lower() in _TRUE | _FALSE:
        spec = spec.strip().lower() in _TRUE
    if spec is None or spec is True:
        return RulesConfig()
    if spec is False:
        return RulesConfig(enabled=False)
    if isinstance(spec, Mapping):
        return from_mapping(spec)
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        return from_mapping(load_yaml_mapping(path, "rules file"), source=f"{path}: rules")
    raise _fail("rules", spec, "true, false, a path to a YAML file or a mapping")
