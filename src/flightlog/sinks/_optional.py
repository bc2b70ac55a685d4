"""One clear error when an optional sink's package is missing, raised at ``init``."""

from __future__ import annotations

import importlib.util
import sys


def require(module: str, sink: str, extra: str) -> None:
    """Raise ImportError with the ``pip`` line to run, without importing ``module`` (it may take seconds)."""
    try:
        missing = (module in sys.modules and sys.modules[module] is None) or importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        missing = True
    if missing:
        raise ImportError(f"flightlog: the {sink!r} sink needs the {module} package; install it with: pip install 'flightlog[{extra}]'")
