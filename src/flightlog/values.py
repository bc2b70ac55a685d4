"""Metric values: a cheap snapshot on the training thread, full resolution on the writer.

On the training thread only this happens: plain Python values pass through
untouched; a CUDA tensor is copied to pinned host memory with ``non_blocking=True``
plus a CUDA event recorded behind the copy (no ``.item()``, no synchronisation; the
writer thread later waits on the event, ``Event.synchronize`` releases the GIL, and
reads the number); a CPU tensor, which has no device to wait for, is read at once (a
0-d one with ``.item()``, a small vector copied), so an in-place update after ``log``
cannot change what was logged.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Collection, Iterable, Mapping

# Types that need no snapshot and no resolution beyond the non-finite check.
PLAIN_TYPES = frozenset({float, int, bool, str, type(None)})
# Small vectors (per-expert load, a few quantiles) are logged as lists; bigger ones are refused.
MAX_ELEMENTS = 64


class PendingTensor:
    """A device tensor being copied to the host; resolved by the writer thread."""

    __slots__ = ("host", "event")

    def __init__(self, host: Any, event: Any) -> None:
        self.host = host
        self.event = event

    def resolve(self) -> Any:
        if self.event is not None:
            self.event.synchronize()  # releases the GIL while the device finishes the copy
        return _tensor_value(self.host)


def _tensor_value(tensor: Any) -> Any:
    if tensor.numel() == 1:
        return tensor.item()
    return tensor.tolist()


class SharedVector:
    """A vector several logged values are derived from: snapshotted (one device-to-host
    copy) and resolved (one read) once, whichever of those values comes first. It is a
    tensor, or a tuple/list of 0-d CPU tensors (nothing to copy, so not stacked)."""

    __slots__ = ("tensor", "pending", "values")

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor  # kept: a distributed reduction may still derive on the device
        # 0-d CPU norms are flightlog's own fresh tensors with nothing to copy: captured as
        # they are, so Run.log has nothing to do for the values derived from them.
        self.pending: Any = tensor if isinstance(tensor, (list, tuple)) else None
        self.values: list[float] | None = None

    def snapshot(self) -> None:
        # flightlog's own fresh tensors: no one updates them in place, so CPU ones need no copy.
        if self.pending is None:  # (a list of 0-d CPU norms was captured in __init__)
            source = self.tensor
            self.pending = snapshot_value(source) if source.is_cuda else source

    def resolve(self) -> list[float]:
        if self.values is None:
            self.snapshot()  # (a value built but never passed through snapshot)
            pending = self.pending
            if isinstance(pending, (list, tuple)):
                self.values = [t.item() for t in pending]
            else:  # a device copy, or a CPU vector (model-parallel norms gathered on a CPU device)
                value = pending.resolve() if type(pending) is PendingTensor else _tensor_value(pending)
                self.values = value if isinstance(value, list) else [value]
        return self.values

    def as_tensor(self) -> Any:
        """The vector as one tensor on its device."""
        source = self.tensor
        if isinstance(source, (list, tuple)):
            import torch

            return torch.stack(source)
        return source


def resolve_together(vectors: list[SharedVector]) -> None:
    """Resolve the vectors of 0-d CPU tensors among ``vectors`` with one ``stack`` and one
    read (writer thread): each ``.item()`` lets go of the GIL and must win it back from
    the training thread, so a chunk of records reads its gradient norms in one go rather
    than one number at a time. Vectors it cannot take are left to :meth:`SharedVector.resolve`."""
    todo = list({id(v): v for v in vectors if v.values is None and type(v.pending) in (list, tuple)}.values())
    if len(todo) < 2:
        return
    import torch

    try:
        flat = torch.stack([t for v in todo for t in v.pending]).tolist()
    except (RuntimeError, TypeError):  # mixed dtypes or devices: one by one, as usual
        return
    start = 0
    for vector in todo:
        end = start + len(vector.pending)
        vector.values = flat[start:end]
        start = end


class Derived:
    """A number the writer thread computes from a :class:`SharedVector`: the training
    thread hands over one vector, and the arithmetic that turns it into metrics (the
    gradient norms of the adapter and backbone groups) launches no kernels there.

    ``derive`` maps the host values (a list of floats) to the number; its ``on_tensor``
    does the same with tensor ops on the vector itself, for a distributed reduction that
    keeps values on the device. ``float()`` resolves on the spot (waiting for the device:
    not for a training loop).
    """

    __slots__ = ("source", "derive")

    def __init__(self, source: SharedVector, derive: Any) -> None:
        self.source = source
        self.derive = derive

    def value(self) -> float:
        return float(self.derive(self.source.resolve()))

    __float__ = value

    def as_tensor(self) -> Any:
        """The value as a 0-d tensor on the vector's device (no host round trip)."""
        return self.derive.on_tensor(self.source.as_tensor())

    def scaled_to(self, total: "Derived", target: float) -> "Derived":
        """This value times ``target / total`` (0 when ``total`` is 0), e.g. a gradient norm
        split rescaled to another measurement of the total norm."""
        return Derived(self.source, _Scaled(self.derive, total.derive, float(target)))

    def __repr__(self) -> str:
        return f"Derived({self.derive!r})"


class _Scaled:
    __slots__ = ("own", "total", "target")

    def __init__(self, own: Any, total: Any, target: float) -> None:
        self.own, self.total, self.target = own, total, target

    def __call__(self, values: list[float]) -> float:
        whole = self.total(values)
        return self.own(values) * (self.target / whole) if whole > 0 else 0.0

    def on_tensor(self, tensor: Any) -> Any:
        import torch

        own, whole = self.own.on_tensor(tensor), self.total.on_tensor(tensor)
        return torch.where(whole > 0, own * (self.target / whole.clamp(min=1e-30)), torch.zeros_like(own))

    def __repr__(self) -> str:
        return f"{self.own!r} scaled to {self.target:g} / {self.total!r}"


# Tensor classes met so far (torch.Tensor, nn.Parameter, subclasses): a set lookup, as a
# class's __module__ costs microseconds on the training thread's cold caches.
_TENSOR_TYPES: set[type] = set()


def is_tensor_type(kind: type) -> bool:
    """Whether ``kind`` is a torch tensor class (without importing torch)."""
    if kind in _TENSOR_TYPES:
        return True
    torch = sys.modules.get("torch") if kind.__module__.startswith("torch") else None
    if torch is not None and issubclass(kind, torch.Tensor):
        _TENSOR_TYPES.add(kind)
        return True
    return False


def snapshot_value(value: Any) -> Any:
    """Called on the training thread for a non-plain value: capture it without syncing."""
    kind = type(value)
    if kind in _TENSOR_TYPES or is_tensor_type(kind):  # (its first test inlined: Run.log's path)
        if value.is_cuda:
            import torch

            host = value.detach().to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            return PendingTensor(host, event)
        # A CPU tensor: there is no device to wait for, so read it now. A later in-place
        # update (an accumulator zeroed after logging) must not change what was logged.
        try:
            return value.item()  # one element (the common case: a loss)
        except (RuntimeError, ValueError):  # more (or none): a private copy
            return PendingTensor(value.detach().clone(), None)
    if kind is Derived:
        value.source.snapshot()
    return value


def snapshot(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A private copy of the user's metrics; device tensors start their host copy."""
    return snapshot_in_place(dict(metrics))


def snapshot_in_place(metrics: dict[str, Any]) -> dict[str, Any]:
    """:func:`snapshot` of a dict that is already flightlog's own copy (no second copy)."""
    for key, value in metrics.items():
        kind = type(value)
        if kind in PLAIN_TYPES or (kind is Derived and value.source.pending is not None):
            continue  # (a derived value whose vector is captured: nothing to do, no call)
        metrics[key] = snapshot_value(value)
    return metrics


class UnsupportedValue(TypeError):
    """A metric value that cannot be written faithfully."""


def resolve_value(value: Any, key: str) -> Any:
    """The JSON-ready form of one value; raises UnsupportedValue naming the key."""
    kind = type(value)
    if kind is float:
        return value if value - value == 0.0 else ("NaN" if value != value else ("Infinity" if value > 0 else "-Infinity"))
    if kind is int:
        return _check_int(value, key)
    if kind in PLAIN_TYPES:
        return value
    if kind is Derived:
        return resolve_value(value.value(), key)
    if kind is PendingTensor:
        if value.host.numel() > MAX_ELEMENTS:
            raise UnsupportedValue(
                f"metric {key!r}: tensor of shape {tuple(value.host.shape)} is too large to log as a value "
                "(log a scalar or a summary such as its mean)"
            )
        return resolve_value(value.resolve(), key)
    if kind is dict:
        return {str(k): resolve_value(v, f"{key}.{k}") for k, v in value.items()}
    if kind is list or kind is tuple:
        return [resolve_value(v, f"{key}[{i}]") for i, v in enumerate(value)]
    module = kind.__module__
    if module == "numpy":
        if getattr(value, "ndim", 1) == 0 or not hasattr(value, "ndim"):
            return resolve_value(value.item(), key)
        if value.size <= MAX_ELEMENTS:
            return resolve_value(value.tolist(), key)
        raise UnsupportedValue(
            f"metric {key!r}: numpy array of shape {tuple(value.shape)} is too large to log as a value "
            "(log a scalar or a summary such as its mean)"
        )
    if is_tensor_type(kind):
        return resolve_value(snapshot_value(value), key)
    if isinstance(value, float):  # float subclasses
        return resolve_value(float(value), key)
    if isinstance(value, int):  # int subclasses, IntEnum
        return _check_int(int(value), key)
    if isinstance(value, str):
        return str(value)
    raise UnsupportedValue(
        f"metric {key!r}: values of type {kind.__module__}.{kind.__qualname__} cannot be logged; "
        "use numbers, strings, bools, None, lists, dicts, numpy scalars or 0-d tensors"
    )


_NUMBER_TYPES = frozenset({float, int, bool})


def finite_sum(values: Iterable[Any]) -> bool:
    """Whether values known to be plain scalars are all finite numbers, with one C-level
    ``sum``: its result is finite exactly when every summand is; a str or None makes it
    raise, and so does an integer beyond the float range among floats (both answer False)."""
    try:
        total = sum(values)
    except (TypeError, OverflowError):
        return False
    return total - total == 0


def finite_numbers(values: Collection[Any]) -> bool:
    """Whether every value (a list, or a dict's values: read twice) is a finite
    int/float/bool, with C-level calls only: ``map(type, ...)`` and :func:`finite_sum`."""
    return _NUMBER_TYPES.issuperset(map(type, values)) and finite_sum(values)


# Integers are written as JSON numbers; beyond the float range no reader can hold one
# (and the encoder refuses it), so such a value is refused with a message naming its key.
_FLOAT_RANGE_INT = int(sys.float_info.max)


def _check_int(value: int, key: str) -> int:
    if -_FLOAT_RANGE_INT <= value <= _FLOAT_RANGE_INT:
        return value
    raise UnsupportedValue(f"metric {key!r}: an integer of {value.bit_length()} bits is beyond the range of a float and cannot be logged as a number")


_TEXT_TYPES = (str, dict, list, tuple)


def resolve_record(record: dict[str, Any], problems: list[str]) -> bool:
    """Resolve every value in place; return whether any value is text or a container.

    Unsupported values are dropped and described in ``problems``. The common case, a
    dict of finite numbers, is decided by :func:`finite_numbers` (C-level calls only).
    """
    if finite_numbers(record.values()):
        return False
    bad: list[str] = []
    has_text = False
    for key, value in record.items():
        kind = type(value)
        if kind is float:
            if value - value != 0.0:
                record[key] = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
            continue
        if kind is bool or value is None or (kind is int and -_FLOAT_RANGE_INT <= value <= _FLOAT_RANGE_INT):
            continue
        try:
            resolved = record[key] = resolve_value(value, key)
        except UnsupportedValue as exc:
            problems.append(str(exc))
            bad.append(key)
            continue
        except Exception as exc:  # a tensor whose copy failed, a broken __float__ ...
            problems.append(f"metric {key!r}: could not be read ({type(exc).__name__}: {exc})")
            bad.append(key)
            continue
        if isinstance(resolved, _TEXT_TYPES):
            has_text = True
    for key in bad:
        del record[key]
    return has_text


def is_finite_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)
