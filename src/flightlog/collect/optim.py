"""Learning rate from the optimizer and the schedule's stage (warmup / stable).

The stage tells a reader why the loss moves as it does (the seeds' example: a loss
that rises during warmup is normal). It is derived from the number of warmup steps,
read off the scheduler where the scheduler says it, else given by the user.
"""

from __future__ import annotations

from typing import Any

WARMUP = "warmup"
STABLE = "stable"


def learning_rate(optimizer: Any, group: int = 0) -> Any:
    """The current learning rate of a parameter group (a float, or the tensor a capturable optimizer keeps)."""
    groups = getattr(optimizer, "param_groups", None)
    if not groups:
        raise TypeError(f"flightlog: {type(optimizer).__name__} has no param_groups; pass a torch optimizer")
    lr = groups[group]["lr"]
    return lr.detach().clone() if hasattr(lr, "detach") else lr


def warmup_steps_of(scheduler: Any) -> int | None:
    """Warmup length of common schedulers, or None when the scheduler does not say.

    Knows HF's ``get_*_schedule_with_warmup`` (a ``LambdaLR`` over a partial with
    ``num_warmup_steps``), ``LinearLR`` ramping up, ``SequentialLR`` whose first part is
    such a ramp, and ``OneCycleLR``.
    """
    if scheduler is None:
        return None
    name = type(scheduler).__name__
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas:
        keywords = getattr(lambdas[0], "keywords", None) or {}
        if isinstance(keywords.get("num_warmup_steps"), int):
            return int(keywords["num_warmup_steps"])
    if name == "LinearLR" and getattr(scheduler, "start_factor", 1) < getattr(scheduler, "end_factor", 1):
        return int(scheduler.total_iters)
    if name == "SequentialLR":
        first = scheduler._schedulers[0] if getattr(scheduler, "_schedulers", None) else None
        milestones = getattr(scheduler, "_milestones", None)
        if first is not None and milestones and warmup_steps_of(first) is not None:
            return int(milestones[0])
    if name == "OneCycleLR":
        phases = getattr(scheduler, "_schedule_phases", None)
        if phases:
            return int(phases[0]["end_step"]) + 1
    return None


def stage(step: int, warmup_steps: int | None) -> str | None:
    """``warmup`` while ``step`` (1-based, completed optimizer steps) is within warmup, else ``stable``."""
    if warmup_steps is None:
        return None
    return WARMUP if step <= warmup_steps else STABLE
