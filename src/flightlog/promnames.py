"""Prometheus names shared by the exporter sink and the generated alert rules.

One place, so that ``flightlog alerts prometheus-rules`` and the ``/metrics`` endpoint
agree. Every numeric field of a metrics record is a gauge named ``flightlog_<field>``
(``flightlog_loss``, ``flightlog_grad_norm``, ``flightlog_gpu_memory_mb`` ...), labelled
``run`` (the run name) and ``run_id``; two gauges say where the run is: the last step and when it was logged.
"""

from __future__ import annotations

import re
from typing import Final

PREFIX: Final = "flightlog_"
LAST_STEP: Final = "flightlog_last_step"
"""Gauge: the last optimizer step logged."""
LAST_STEP_TIMESTAMP: Final = "flightlog_last_step_timestamp_seconds"
"""Gauge: Unix time of the last metrics record (the stall rule compares it with ``time()``)."""
ALERTS_TOTAL: Final = "flightlog_alerts_total"
"""Counter: alerts the run's own rules raised, labelled ``rule`` and ``severity``."""
RUN_LABELS: Final = ("run", "run_id")
"""Labels on every series: ``run`` is the run name (as the exporter sink writes them)."""

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(field: str) -> str:
    """The gauge for a record field: ``loss`` -> ``flightlog_loss``; other characters become ``_``."""
    return PREFIX + _INVALID.sub("_", field)


def alert_name(rule: str) -> str:
    """The Prometheus/Alertmanager alert name for a rule: ``loss_spike`` -> ``FlightlogLossSpike``."""
    return "Flightlog" + "".join(part.capitalize() for part in re.split(r"[^a-zA-Z0-9]+", rule) if part)
