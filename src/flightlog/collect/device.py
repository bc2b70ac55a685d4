"""Accelerator memory, precision and the GradScaler's scale, read without a device sync.

``torch.cuda.memory_allocated`` and friends read the caching allocator's host-side
counters: no kernel, no synchronisation. The GradScaler's scale is handed on as the
tensor it is (``get_scale()`` would call ``.item()`` and wait for the device).
"""

from __future__ import annotations

import sys
from typing import Any

MB = 2**20


def cuda_available() -> bool:
    """True when torch is loaded and sees a CUDA device (never imports torch itself)."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_available())
    except Exception:
        return False


class CudaMemory:
    """``gpu_memory_mb`` (allocated), ``gpu_memory_reserved_mb``, ``gpu_memory_peak_mb``, ``gpu_memory_total_mb``."""

    def __init__(self, device: Any = None) -> None:
        import torch

        self.torch = torch
        self.device = torch.cuda.current_device() if device is None else device
        self.total_mb = round(torch.cuda.get_device_properties(self.device).total_memory / MB, 1)

    def read(self) -> dict[str, float]:
        cuda = self.torch.cuda
        return {
            "gpu_memory_mb": round(cuda.memory_allocated(self.device) / MB, 1),
            "gpu_memory_reserved_mb": round(cuda.memory_reserved(self.device) / MB, 1),
            "gpu_memory_peak_mb": round(cuda.max_memory_allocated(self.device) / MB, 1),
            "gpu_memory_total_mb": self.total_mb,
        }

    def summary(self) -> str:
        return str(self.torch.cuda.memory_summary(self.device, abbreviated=True))


_PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def precision_name(dtype: Any) -> str:
    """``fp32`` / ``fp16`` / ``bf16`` for a torch dtype (or its name)."""
    name = str(dtype).replace("torch.", "")
    if name in _PRECISIONS:
        return _PRECISIONS[name]
    if name in _PRECISIONS.values():
        return name
    if name.startswith("float8"):
        return "fp8"
    raise ValueError(f"flightlog: precision {dtype!r} is not one of fp32, fp16, bf16 (or a torch float dtype)")


def detect_precision(model: Any = None, scaler: Any = None) -> str | None:
    """fp16 when a GradScaler is enabled (mixed fp16), else the dtype of the model's floating parameters."""
    if scaler is not None and getattr(scaler, "is_enabled", lambda: False)():
        return "fp16"
    if model is not None:
        for param in model.parameters():
            if param.is_floating_point():
                return precision_name(param.dtype)
    return None


def scaler_scale(scaler: Any) -> Any:
    """The GradScaler's current scale as a tensor copy (None when disabled or not yet used)."""
    if scaler is None or not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)
    if scale is None:
        return None
    # A CPU tensor is updated in place by the scaler: copy it; a CUDA one is copied by run.log.
    return scale.detach() if scale.is_cuda else scale.detach().clone()
