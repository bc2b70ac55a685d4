"""The seam between ``flightlog watch`` and the diagnosis rules.

A watched run's records flow through the Run's processor chain like any other run's,
so the rules engine is just one more processor. ``processor_factories`` builds the
list the watcher adds: the rules engine when :mod:`flightlog.rules` is installed
(unless disabled), then any user processors named ``module:factory`` (``factory(run)``
returns a processor).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

from flightlog.run import Run

ProcessorFactory = Callable[[Run], Any]


def rules_factory(spec: str | None = None) -> ProcessorFactory | None:
    """A factory for the rules engine, or None when :mod:`flightlog.rules` is not available."""
    try:
        from flightlog.rules.engine import RulesEngine  # type: ignore[import-not-found]
        from flightlog.rules.config import load  # type: ignore[import-not-found]
    except ImportError:
        return None
    config = load(spec) if spec else None

    def make(run: Run) -> Any:
        return RulesEngine(config, emit=run.writer.emit)

    return make


def import_factory(spec: str) -> ProcessorFactory:
    """``package.module:factory`` -> the factory; errors name what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"flightlog watch: --processor {spec!r} must look like package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"flightlog watch: --processor {spec!r}: cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"flightlog watch: --processor {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def processor_factories(*, rules: bool = True, rules_spec: str | None = None, extra: Iterable[str] = ()) -> tuple[list[ProcessorFactory], bool]:
    """The factories to add, and whether the rules engine is among them."""
    factories: list[ProcessorFactory] = []
    engine = rules_factory(rules_spec) if rules else None
    if engine is not None:
        factories.append(engine)
    factories.extend(import_factory(spec) for spec in extra)
    return factories, engine is not None
