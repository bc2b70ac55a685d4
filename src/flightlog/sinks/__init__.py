"""Sinks: one module a sink, one small interface (:class:`~flightlog.sinks.base.Sink`).

``build_sink(name, config)`` constructs the built-in sinks by name; optional backends
import their dependency inside their own module, so naming a sink is what pays for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flightlog.sinks.base import BaseSink, Record, Sink

if TYPE_CHECKING:
    from flightlog.config import Config

# name -> "module:factory"; the factory takes (config, run_dir) and returns a Sink.
BUILTIN_SINKS: dict[str, str] = {
    "jsonl": "flightlog.sinks.jsonl:from_config",
    "console": "flightlog.sinks.console:from_config",
    "csv": "flightlog.sinks.csv:from_config",
    # Optional backends (docs/sinks.md); each imports its package only when built.
    "tensorboard": "flightlog.sinks.tensorboard:from_config",
    "prometheus": "flightlog.sinks.prometheus:from_config",
    "wandb": "flightlog.sinks.wandb:from_config",
    "mlflow": "flightlog.sinks.mlflow:from_config",
}


def build_sink(name: str, config: "Config", run_dir: Any) -> Sink:
    """A built-in sink by name; raises ``ValueError`` naming the known sinks."""
    try:
        target = BUILTIN_SINKS[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_SINKS))
        raise ValueError(f"unknown sink {name!r}; known sinks: {known}") from None
    module_name, factory = target.split(":")
    return getattr(importlib.import_module(module_name), factory)(config, run_dir)


def build_sinks(specs: list[Any], config: "Config", run_dir: Any) -> list[Sink]:
    """Names built, objects passed through; if one fails, the ones already built are closed
    (no leaked files, threads or ports) and the error propagates to ``init``."""
    built: list[Sink] = []
    try:
        for spec in specs:
            built.append(build_sink(spec, config, run_dir) if isinstance(spec, str) else spec)
    except BaseException:
        for sink in built:
            if any(sink is spec for spec in specs):
                continue  # the caller's own objects are the caller's to close
            try:
                sink.close()
            except Exception:
                pass
        raise
    return built


__all__ = ["BUILTIN_SINKS", "BaseSink", "Record", "Sink", "build_sink", "build_sinks"]
