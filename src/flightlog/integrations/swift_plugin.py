"""ms-swift plugin: registers :class:`~flightlog.integrations.hf.FlightlogCallback` with ms-swift.

ms-swift imports the files given to ``--external_plugins`` before it builds the trainer.
This file registers the callback both ways ms-swift offers:

* ms-swift 4: ``callbacks_map["flightlog"]``, switched on with ``--callbacks flightlog``;
* ms-swift 3: appended to ``swift.plugin.extra_callbacks``, which every trainer gets.

    swift sft --model ... --output_dir output \\
        --external_plugins "$(python -m flightlog.integrations.swift_plugin)" --callbacks flightlog

Describe the run with ``FLIGHTLOG_*`` variables (``FLIGHTLOG_TASK_TYPE=sft``,
``FLIGHTLOG_DATASET=alpaca-en``, ``FLIGHTLOG_SINKS=jsonl,console``...).
``python -m flightlog.integrations.swift_plugin`` prints this file's path.
"""

from __future__ import annotations

from typing import Any


def register(**options: Any) -> list[str]:
    """Register the callback with whichever ms-swift is installed; returns where it went."""
    from flightlog.integrations.hf import FlightlogCallback

    where: list[str] = []
    callbacks_map = None
    try:
        from swift.callbacks.mapping import callbacks_map  # type: ignore[import-not-found,no-redef]
    except ImportError:
        try:
            from swift.callbacks import callbacks_map  # type: ignore[import-not-found,no-redef]
        except ImportError:
            pass
    if isinstance(callbacks_map, dict):
        callbacks_map["flightlog"] = lambda args=None, trainer=None: FlightlogCallback(**options)
        where.append("swift.callbacks callbacks_map['flightlog']")
    else:
        try:
            from swift.plugin import extra_callbacks  # type: ignore[import-not-found]
        except ImportError:
            extra_callbacks = None
        if isinstance(extra_callbacks, list):
            if not any(isinstance(c, FlightlogCallback) for c in extra_callbacks):
                extra_callbacks.append(FlightlogCallback(**options))
            where.append("swift.plugin.extra_callbacks")
    return where


if __name__ == "__main__":
    print(__file__)
else:
    try:
        import swift  # noqa: F401  (only register inside an ms-swift process)
    except ImportError:
        pass
    else:
        register()
