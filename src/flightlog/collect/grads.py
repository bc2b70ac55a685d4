"""Gradient norms, total and split between adapter (LoRA) and backbone parameters.

One fused ``torch._foreach_norm`` over all gradients gives the per-parameter norms in
one launch instead of one per parameter, stacked into one vector (a second launch). That
vector is all the training thread makes: with the adapter parameters ordered first, the
writer thread derives the adapter and backbone norms from the two ends of it and the
total from all of it (:class:`flightlog.values.Derived`). Nothing here calls ``.item()``,
so the training thread never waits for the device.
"""

from __future__ import annotations

import math
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import Any, Iterable, Sequence

from flightlog.values import Derived, SharedVector

# Substrings of parameter names that belong to an adapter (peft LoRA, IA3, VeRA, adapters).
ADAPTER_PATTERNS: tuple[str, ...] = ("lora_", "ia3_", "vera_", "adapter")

_GRAD = attrgetter("grad")
_IS_CPU = attrgetter("is_cpu")
_NONES = repeat(None)  # (an endless operand for map(is_not, grads, _NONES))


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
        self.adapters = sum(is_adapter)

    def compute(self) -> dict[str, Any]:
        """The norms, as values the writer thread derives from one vector of per-gradient
        norms (empty dict if no gradient): :meth:`derive` of :meth:`capture`.

        ``float(value)`` reads one on the spot.
        """
        return self.derive(self.capture())

    def capture(self) -> tuple[SharedVector, int] | None:
        """The per-gradient norms (adapters first) and how many of them are adapters'; None
        if no parameter has a gradient. The training thread's part: this runs in the
        optimizer's pre-step hook, with every cache cold, so the common case (every
        gradient present, all on the CPU) is decided by C-level passes only.

        The training thread launches one fused norm kernel per device (plus one stack off
        the CPU) and copies nothing to the device, so this is safe under
        ``torch.cuda.set_sync_debug_mode("error")``; the square roots of the group sums
        are the writer's arithmetic (float64, on the host).
        """
        import torch

        grads = list(map(_GRAD, self.params))
        if all(map(is_not, grads, _NONES)):
            adapters = self.adapters
        else:  # some parameters have no gradient (frozen, or unused this step)
            adapters = sum(compress(self.is_adapter, map(is_not, grads, _NONES)))
            grads = [g for g in grads if g is not None]
            if not grads:
                return None
        # (No no_grad() block: gradients do not require grad, so no graph is built; each
        # kernel launch avoided counts at this size, see docs/benchmarks.md.)
        return SharedVector(_per_tensor_norms(torch, grads)), adapters

    def derive(self, captured: tuple[SharedVector, int] | None) -> dict[str, Any]:
        """The metrics of a :meth:`capture` (the writer thread calls this for StepTimer's records)."""
        if captured is None:
            return {}
        norms, adapters = captured
        total = Derived(norms, _Slice(0, None))
        if not self.has_adapter:
            return {"grad_norm": total}
        return {
            "grad_norm": total,
            "grad_norm_adapter": Derived(norms, _Slice(0, adapters)),
            "grad_norm_backbone": Derived(norms, _Slice(adapters, None)),
        }


class _Slice:
    """The L2 norm of a group: a slice of the per-gradient norms (adapters come first)."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int | None) -> None:
        self.start, self.stop = start, stop

    def __call__(self, values: list[float]) -> float:
        return math.hypot(*values[self.start : self.stop])

    def on_tensor(self, tensor: Any) -> Any:
        import torch

        return torch.linalg.vector_norm(tensor[self.start : self.stop])

    def __repr__(self) -> str:
        return f"norm of per-gradient norms [{self.start}:{self.stop}]"


def _per_tensor_norms(torch: Any, grads: list[Any]) -> Any:
    """The L2 norm of each gradient, fused per device (model parallel spreads them): on the
    CPU, where there is no copy to save, the list of 0-d norms as it is (one kernel launch
    fewer); else one float32 vector on the first gradient's device, gathered without a host
    round trip (a device's norms then travel to the host in one copy)."""
    if all(map(_IS_CPU, grads)):
        return torch._foreach_norm(grads, 2.0, dtype=torch.float32)
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
