"""Gradient norms, total and split between adapter (LoRA) and backbone parameters.

One fused ``torch._foreach_norm`` over every gradient (one kernel launch per device and
dtype instead of one per parameter), then the per-group norms come from the stacked
per-parameter norms. The results stay tensors: nothing here calls ``.item()``, so the
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
        self._groups: dict[Any, Any] = {}

    def compute(self) -> dict[str, Any]:
        """The norms as 0-d float32 tensors on the gradients' device (empty dict if no gradient)."""
        import torch

        grads: list[Any] = []
        adapter: list[bool] = []
        for param, is_adapter in zip(self.params, self.is_adapter):
            grad = param.grad
            if grad is not None:
                grads.append(grad.detach())
                adapter.append(is_adapter)
        if not grads:
            return {}
        norms = _stacked_norms(torch, grads)
        squares = norms * norms
        if not self.has_adapter:
            return {"grad_norm": squares.sum().sqrt()}
        # One matrix-vector product sums the squares per group: [adapter, backbone].
        key = (norms.device, tuple(adapter))
        groups = self._groups.get(key)
        if groups is None:
            flags = torch.tensor(adapter, dtype=torch.float32)
            groups = torch.stack([flags, 1.0 - flags]).to(norms.device)
            self._groups = {key: groups}  # the set of parameters with gradients rarely changes
        split = (groups @ squares).sqrt()
        return {"grad_norm": squares.sum().sqrt(), "grad_norm_adapter": split[0], "grad_norm_backbone": split[1]}


def _stacked_norms(torch: Any, grads: list[Any]) -> Any:
    """Per-gradient L2 norms as one float32 vector, in the order of ``grads``."""
    devices = {g.device for g in grads}
    if len(devices) == 1:
        return torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32))
    # Model parallel across devices: one fused call per device, gathered on the first.
    target = grads[0].device
    order: dict[Any, list[int]] = {}
    for i, g in enumerate(grads):
        order.setdefault(g.device, []).append(i)
    result = torch.empty(len(grads), dtype=torch.float32, device=target)
    for device, idx in order.items():
        part = torch.stack(torch._foreach_norm([grads[i] for i in idx], 2.0, dtype=torch.float32))
        result[torch.tensor(idx, device=target)] = part.to(target, non_blocking=True)
    return result
