"""Actions on alerts: the optional stop-gracefully policy.

With ``on_critical: stop`` in the rules config, a critical alert (NaN/Inf loss, a
stall, any rule configured ``severity: critical``) sets ``run.should_stop = True`` and
``run.stop_reason``. flightlog never kills the training: the loop (or an integration)
checks the flag at a step boundary, saves a checkpoint and returns::

    for step in range(max_steps):
        ...
        run.log({"loss": loss}, step=step)
        if run.should_stop:
            save_checkpoint(step)
            break

The HF integration maps it to ``control.should_save = control.should_training_stop = True``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


class StopPolicy:
    """``on_alert`` callable: asks the run to stop on alerts of the given severities."""

    def __init__(self, run: Any, severities: tuple[str, ...] = ("critical",),
                 announce: Callable[[str], None] | None = None) -> None:
        self.run = run
        self.severities = severities
        self.announce = announce

    def __call__(self, alert: Mapping[str, Any]) -> None:
        if alert.get("severity") not in self.severities or getattr(self.run, "should_stop", False):
            return
        reason = f"{alert.get('rule', '?')}: {alert.get('message', '')}"
        self.run.stop_reason = reason
        self.run.should_stop = True
        if self.announce is not None:
            self.announce(f"critical alert ({reason}); run.should_stop is set: the training is asked to save and stop")
