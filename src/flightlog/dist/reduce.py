"""One logging step's reduction across ranks: one small gather, one packed all-reduce.

1. A fixed-size gather of per-rank figures: a hash of the metric keys, the step, the
   step time and the peak memory (the straggler detector's input).
2. If every rank logs the same keys (the hashes agree), all numeric metrics are packed
   into ONE float64 tensor and summed in ONE all-reduce. Means travel as (sum, count)
   and weighted means as (sum of w*x, sum of w); max and min travel as one row per rank
   (each rank fills its own row, zeros elsewhere, so the sum is a gather). A key a rank
   does not log counts as absent (excluded), never as zero; a NaN a rank does log
   stays NaN, because a diverging rank must be seen.
3. If the hashes differ, the key lists are gathered once as objects and the union is
   used (cached per combination of hashes): ranks logging different keys never hang.

Without a process group none of this runs: the caller keeps its local values.
"""

from __future__ import annotations

import hashlib
import math
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from flightlog.dist.comm import Comm
from flightlog.dist.policy import Policy
from flightlog.values import Derived, PendingTensor, is_tensor_type

SUMMED = ("mean", "sum")
ROWED = ("max", "min")


@dataclass
class Reduced:
    """The outcome of one logging step on this rank."""

    values: dict[str, Any]  # reduced numeric metrics (rank-0 copies of non-numeric ones are not here)
    steps: list[float]
    step_times: list[float]
    memory_mb: list[float]
    key_mismatch: dict[int, list[str]] = field(default_factory=dict)  # rank -> keys it does not log


def key_hash(keys: list[str]) -> int:
    """52 bits, so it travels exactly in a float64 next to the other figures."""
    digest = hashlib.blake2b("\0".join(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 12


def peak_memory_mb() -> float:
    """Peak device memory when CUDA is in use (a host-side counter: no sync), else peak RSS."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.max_memory_allocated() / 2**20
    except Exception:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Reducer:
    def __init__(self, comm: Comm, policy: Policy, reduce_values: bool = True) -> None:
        self.comm = comm
        self.policy = policy
        self.reduce_values = reduce_values
        self.world = comm.world
        self.rank = comm.rank
        self._last_keys: list[str] | None = None
        self._last_hash = 0
        self._unions: dict[tuple[int, ...], tuple[list[str], dict[int, list[str]]]] = {}
        self._prev_exit: float | None = None
        self._prev_step: int | None = None

    # ------------------------------------------------------------------ one step
    def __call__(self, data: dict[str, Any], step: int) -> Reduced:
        entered = time.perf_counter()
        numeric: dict[str, Any] = {}
        if self.reduce_values:
            device_ok = self.comm.device is not None
            op = self.policy.op
            for key, value in data.items():
                number = _number(value, device_ok)
                if number is not None and op(key) != "rank0":
                    numeric[key] = number
        keys = sorted(numeric)
        if keys != self._last_keys:
            self._last_keys, self._last_hash = keys, key_hash(keys)
        step_time = math.nan
        if self._prev_exit is not None and self._prev_step is not None:
            step_time = (entered - self._prev_exit) / max(1, step - self._prev_step)
        rows = self.comm.all_gather_floats([float(self._last_hash), float(step), step_time, peak_memory_mb()])
        result = Reduced({}, [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows])
        if self.reduce_values:
            hashes = tuple(int(r[0]) for r in rows)
            agreed = keys
            if any(h != hashes[0] for h in hashes):
                agreed, result.key_mismatch = self._reconcile(hashes, keys)
            if agreed:
                result.values = self._reduce(agreed, numeric)
        self._prev_exit, self._prev_step = time.perf_counter(), step
        return result

    def _reconcile(self, hashes: tuple[int, ...], keys: list[str]) -> tuple[list[str], dict[int, list[str]]]:
        cached = self._unions.get(hashes)
        if cached is None:
            per_rank = self.comm.all_gather_objects(keys)
            union = sorted(set().union(*map(set, per_rank)))
            lacking = {r: sorted(set(union) - set(k)) for r, k in enumerate(per_rank) if len(k) != len(union)}
            cached = self._unions[hashes] = (union, lacking)
        return cached

    # ------------------------------------------------------------------ packing
    def _reduce(self, keys: list[str], numeric: dict[str, Any]) -> dict[str, Any]:
        op = self.policy.op
        summed = [k for k in keys if op(k) in SUMMED]
        rowed = [k for k in keys if op(k) in ROWED]
        weighted = self.policy.weight is not None
        width = 4 if weighted else 2
        weight: Any = 0.0
        if weighted:
            w = numeric.get(self.policy.weight)
            if w is not None and (not isinstance(w, float | int) or (math.isfinite(w) and w >= 0)):
                weight = w
        head = len(summed) * width
        items: list[Any] = [0.0] * (head + self.world * len(rowed) * 2)
        for i, key in enumerate(summed):
            x = numeric.get(key)
            if x is None:
                continue
            base = i * width
            items[base], items[base + 1] = x, 1.0
            if weighted:
                items[base + 2], items[base + 3] = weight * x, weight
        row = head + self.rank * len(rowed) * 2
        for j, key in enumerate(rowed):
            x = numeric.get(key)
            if x is not None:
                items[row + 2 * j], items[row + 2 * j + 1] = x, 1.0
        packed = self._pack(items)
        self.comm.all_reduce_sum(packed)
        return self._unpack(packed, summed, rowed, width, numeric)

    def _pack(self, items: list[Any]) -> Any:
        import torch

        tensors = [i for i, x in enumerate(items) if type(x) not in (float, int)]
        if not tensors:
            return torch.tensor(items, dtype=torch.float64)
        # CUDA values: host floats go up with one async copy, device values are scattered in: no sync.
        device = self.comm.device
        on_device = set(tensors)
        host = [0.0 if i in on_device else x for i, x in enumerate(items)]
        packed = torch.tensor(host, dtype=torch.float64).pin_memory().to(device, non_blocking=True)
        index = torch.tensor(tensors, dtype=torch.long).pin_memory().to(device, non_blocking=True)
        values = torch.stack([items[i].detach().reshape(()).to(device=device, dtype=torch.float64) for i in tensors])
        packed.index_copy_(0, index, values)
        return packed

    def _unpack(self, red: Any, summed: list[str], rowed: list[str], width: int, numeric: dict[str, Any]) -> dict[str, Any]:
        import torch

        op = self.policy.op
        head = len(summed) * width
        parts = []
        if summed:
            a = red[:head].view(len(summed), width)
            total, count = a[:, 0], a[:, 1]
            mean = total / count.clamp(min=1.0)
            if width == 4:
                mean = torch.where(a[:, 3] > 0, a[:, 2] / a[:, 3].clamp(min=1e-300), mean)
            parts += [total, mean]
        if rowed:
            b = red[head:].view(self.world, len(rowed), 2)
            present = b[..., 1] > 0
            parts += [
                torch.where(present, b[..., 0], -math.inf).amax(0),
                torch.where(present, b[..., 0], math.inf).amin(0),
            ]
        flat = torch.cat(parts)
        n, m = len(summed), len(rowed)
        slots = {k: (i if op(k) == "sum" else n + i) for i, k in enumerate(summed)}
        slots.update({k: (2 * n + j if op(k) == "max" else 2 * n + m + j) for j, k in enumerate(rowed)})
        out: dict[str, Any] = {}
        if flat.is_cuda:
            host = flat.to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            for key, slot in slots.items():
                out[key] = PendingTensor(host[slot], event)  # a view: read by the writer after the event
            return out
        values = flat.tolist()
        for key, slot in slots.items():
            v = values[slot]
            if type(numeric.get(key)) is int and op(key) != "mean" and v.is_integer():
                v = int(v)
            out[key] = v
        return out


def _number(value: Any, device_ok: bool) -> Any:
    """A float/int for reduction, a CUDA tensor (kept on the device when NCCL can take it), or None."""
    kind = type(value)
    if kind is float or kind is int:
        return value
    if kind is bool or kind is str or value is None:
        return None
    module = kind.__module__
    if module == "numpy":
        if getattr(value, "size", 0) == 1 and getattr(value, "dtype", None) is not None and value.dtype.kind in "fiu":
            return value.item()
        return None
    if is_tensor_type(kind):  # (not torch.Size and the like: torch objects without a dtype)
        if value.numel() != 1 or value.dtype.is_complex or value.dtype == _torch_bool():
            return None
        if value.is_cuda and device_ok:
            return value
        return value.item()  # CPU: no sync; CUDA under gloo: a sync, documented (use NCCL)
    if kind is PendingTensor and value.event is None:
        return _number(value.host, device_ok)
    if kind is Derived:  # gradient norms: derived on the device under NCCL, else on the host
        if device_ok and getattr(value.source.tensor, "is_cuda", False):
            return value.as_tensor()
        return value.value()
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value) if isinstance(value, float) else int(value)
    return None


def _torch_bool() -> Any:
    import torch

    return torch.bool
