"""The seam between ``flightlog watch`` and the diagnosis rules.

A watched run's records flow through its Run's processor chain like any other run's,
so the rules engine is just one more processor. When :mod:`flightlog.rules` is part
of this installation, the Run attaches it itself from its ``rules`` and ``notify``
settings (``flightlog.config``), so the watcher only passes those settings on; the
defaults also come from YAML and ``FLIGHTLOG_RULES``/``FLIGHTLOG_NOTIFY`` as for
any run. User processors (``--processor module:factory``, ``factory(run)`` returns a
processor) are added after the Run exists.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

from flightlog.run import Run

ProcessorFactory = Callable[[Run], Any]


def rules_available() -> bool:
    """Whether Runs here attach the diagnosis rules (``flightlog.rules`` and the ``rules`` setting exist)."""
    from flightlog.config import FIELDS

    if "rules" not in FIELDS:
        return False
    try:
        importlib.import_module("flightlog.rules")
    except ImportError:
        return False
    return True


def rules_options(*, enabled: bool = True, spec: str | None = None, notify: Iterable[str] = ()) -> dict[str, Any]:
    """``init`` options that switch the rules on (with ``spec``, a rules YAML) or off, and add notifiers."""
    notify = list(notify)
    if not rules_available():
        if notify or spec:
            raise ValueError("flightlog watch: --rules/--notify need the diagnosis rules (flightlog.rules), which this installation lacks")
        return {}
    options: dict[str, Any] = {"rules": (spec or True) if enabled else False}
    if notify:
        options["notify"] = notify
    return options


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
