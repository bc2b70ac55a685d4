"""Gradient norms, total and split between adapter (LoRA) and backbone parameters.

One fused ``torch._foreach_norm`` over all gradients gives the per-parameter norms in
one launch instead of one per parameter; with the adapter parameters ordered first, the
adapter and backbone norms are the norms of the two ends of that vector, and the total
is ``hypot(adapter, backbone)``. The results stay tensors: nothing here calls ``.item()``, so the
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
        # Adapter parameters first: one fused norm call over all gradients, then the
        # adapter and backbone norms are the norms of the two ends of its result.
        order = sorted(range(len(params)), key=lambda i: not is_adapter[i])
        self.params = [params[i] for i in order]
        self.is_adapter = [is_adapter[i] for i in order]
        self.has_adapter = any(is_adapter)
        self._zeros: dict[Any, Any] = {}

    def compute(self) -> dict[str, Any]:
        """The norms as 0-d float32 tensors on the gradients' device (empty dict if no gradient).

        One fused norm call for all gradients (per device); no host data is copied to the
        device, so this is safe under ``torch.cuda.set_sync_debug_mode("error")``.
        """
        import torch

        grads: list[Any] = []
        adapters = 0
        for param, is_adapter in zip(self.params, self.is_adapter):
            grad = param.grad
            if grad is not None:
                grads.append(grad)
                adapters += is_adapter
        if not grads:
            return {}
        # (No no_grad() block: gradients do not require grad, so no graph is built; each
        # dispatch avoided counts at this size, see docs/benchmarks.md.)
        norms = _per_tensor_norms(torch, grads)
        vector_norm = torch.linalg.vector_norm
        if not self.has_adapter:
            return {"grad_norm": vector_norm(norms)}
        a = vector_norm(norms[:adapters]) if adapters else self._zero(torch, norms.device)
        b = vector_norm(norms[adapters:]) if adapters < len(grads) else self._zero(torch, norms.device)
        return {"grad_norm": torch.hypot(a, b), "grad_norm_adapter": a, "grad_norm_backbone": b}

    def _zero(self, torch: Any, device: Any) -> Any:
        """A 0-d zero on ``device``, made once (a frozen backbone reads it at every log)."""
        zero = self._zeros.get(device)
        if zero is None:
            zero = self._zeros[device] = torch.zeros((), dtype=torch.float32, device=device)
        return zero


def _per_tensor_norms(torch: Any, grads: list[Any]) -> Any:
    """The L2 norm of each gradient, as one float32 vector on the first gradient's device:
    fused per device (model parallel spreads them), gathered without a host round trip."""
    first = grads[0].device
    if all(g.device == first for g in grads):
        return torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32))
    norms = [None] * len(grads)
    by_device: dict[Any, list[int]] = {}
    for i, g in enumerate(grads):
        by_device.setdefault(g.device, []).append(i)
    for indexes in by_device.values():
        for i, norm in zip(indexes, torch._foreach_norm([grads[i] for i in indexes], 2.0, dtype=torch.float32)):
            norms[i] = norm.to(first, non_blocking=True)
    return torch.stack(norms)
