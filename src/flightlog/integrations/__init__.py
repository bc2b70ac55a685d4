"""Thin adapters from training frameworks onto :class:`flightlog.Run`.

``hf`` (Hugging Face Trainer, and ms-swift whose trainers subclass it), ``lightning``
and ``accelerate``. Each module imports its framework; this package imports nothing.
"""
