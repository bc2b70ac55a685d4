"""Distributed runs: metrics reduced across ranks in one collective, rank 0 writing,
optional per-rank streams, straggler detection, collectives that never hang.

``flightlog.init`` calls :func:`start_run` only when ``torch.distributed`` is already
imported; this package imports torch only inside the functions that need it.
See ``docs/distributed.md``.
"""

from __future__ import annotations

from typing import Any

from flightlog.dist.comm import CollectiveFailure, DistributedTimeout
from flightlog.dist.policy import Policy
from flightlog.dist.straggler import StragglerDetector


def start_run(config: Any, **kwargs: Any) -> Any:
    """This rank's Run under torch.distributed, or None outside a distributed job."""
    from flightlog.dist.runs import start_run as _start

    return _start(config, **kwargs)


__all__ = ["CollectiveFailure", "DistributedTimeout", "Policy", "StragglerDetector", "start_run"]
