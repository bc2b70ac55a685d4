"""Gradient norms, total and split between adapter (LoRA) and backbone parameters.

One fused ``torch._foreach_norm`` per group (adapter, backbone) gives the per-parameter
norms in one launch instead of one per parameter; the group norm is the norm of those,
and the total is ``hypot(adapter, backbone)``. The results stay tensors: nothing here calls ``.item()``, so the
training thread never waits for the device; the writer thread reads the numbers.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

# Substrings of parameter names that belong to an adapter (peft LoRA, IA3, VeRA, adapters).
ADAPTER_PATTERNS: tuple[str, ...] = ("lora_", "ia3_", "vera_", "adapter")


class GradNorms:
    """Computes ``grad_norm``, ``grad_norm_adapter`` and ``grad_norm_backbone`` (L2).

    Parameters without a gradient (a frozen backbone) contribute 0, so a LoRA run
    reads ``grad_norm_backbone == 0``. The adapter/backbone fields are omitted when the
    model has no adapter parameters.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, Any]], adapter_patterns: Sequence[str] = ADAPTER_PATTERNS) -> None:
        if isinstance(adapter_patterns, str) or not all(isinstance(p, str) and p for p in adapter_patterns):
            raise ValueError(f"flightlog: adapter_patterns must be a list of non-empty strings, got {adapter_patterns!r}")
        params: list[Any] = []
        is_adapter: list[bool] = []
        seen: set[int] = set()
        for name, param in named_parameters:
            if id(param) in seen:  # tied weights count once
                continue
            seen.add(id(param))
            params.append(param)
            is_adapter.append(any(p in name for p in adapter_patterns))
        if not params:
            raise ValueError("flightlog: GradNorms got a model without parameters")
        self.params = params
        self.is_adapter = is_adapter
        self.has_adapter = any(is_adapter)

    def compute(self) -> dict[str, Any]:
        """The norms as 0-d float32 tensors on the gradients' device (empty dict if no gradient).

        One fused norm call per group (and device); no host data is copied to the device,
        so this is safe under ``torch.cuda.set_sync_debug_mode("error")``.
        """
        import torch

        if not self.has_adapter:
            grads = [p.grad.detach() for p in self.params if p.grad is not None]
            return {"grad_norm": _group_norm(torch, grads)} if grads else {}
        adapter: list[Any] = []
        backbone: list[Any] = []
        for param, is_adapter in zip(self.params, self.is_adapter):
            grad = param.grad
            if grad is not None:
                (adapter if is_adapter else backbone).append(grad.detach())
        if not adapter and not backbone:
            return {}
        device = (adapter or backbone)[0].device
        a = _group_norm(torch, adapter) if adapter else torch.zeros((), dtype=torch.float32, device=device)
        b = _group_norm(torch, backbone) if backbone else torch.zeros((), dtype=torch.float32, device=device)
        if a.device != b.device:
            b = b.to(a.device, non_blocking=True)
        return {"grad_norm": torch.hypot(a, b), "grad_norm_adapter": a, "grad_norm_backbone": b}


def _group_norm(torch: Any, grads: list[Any]) -> Any:
    """L2 norm over a list of gradients: fused per-tensor norms, then the norm of those.

    Gradients on several devices (model parallel) are reduced per device first; the
    partial norms are gathered on the first gradient's device.
    """
    first = grads[0].device
    if all(g.device == first for g in grads):
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32)))
    by_device: dict[Any, list[Any]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    parts = [_group_norm(torch, group).to(first, non_blocking=True) for group in by_device.values()]
    return torch.linalg.vector_norm(torch.stack(parts))
