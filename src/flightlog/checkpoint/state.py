"""The pieces of training state a checkpoint must carry besides the weights.

Random states (Python, NumPy, torch CPU, every CUDA device) are what make a resumed
run draw the same dropout masks and augmentations; weights are stored under their
canonical names (wrapper prefixes removed) so they load into a model wrapped
differently (DDP, FSDP, ``torch.compile``) or not at all.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

# Attribute names that wrappers insert into parameter names.
WRAPPER_SEGMENTS = ("module", "_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module")
_WRAPPER_RE = re.compile(r"(?:^|(?<=\.))(?:" + "|".join(WRAPPER_SEGMENTS) + r")\.")


def canonical_name(key: str) -> str:
    """``module._orig_mod.layers.0._fsdp_wrapped_module.weight`` -> ``layers.0.weight``.

    Only whole name segments are removed, so a real submodule called ``module`` inside
    the model would be removed too; such a model is told apart by :func:`load_weights`,
    which matches names in the target model the same way.
    """
    return _WRAPPER_RE.sub("", key)


def canonical_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = canonical_name(key)
        if name in out:
            raise ValueError(f"flightlog: parameters {key!r} and another one both map to {name!r} once wrapper prefixes are removed")
        out[name] = value
    return out


def model_weights(model: Any, adapter_only: bool | Callable[[str], bool] = False) -> dict[str, Any]:
    """The model's weights under canonical names; with ``adapter_only`` only the trainable
    parameters (or those whose canonical name the given predicate accepts)."""
    state = model.state_dict()
    if adapter_only:
        if callable(adapter_only):
            keep = {k for k in state if adapter_only(canonical_name(k))}
        else:
            trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            keep = {k for k in state if k in trainable}
        state = {k: v for k, v in state.items() if k in keep}
        if not state:
            raise ValueError("flightlog: adapter_only found no parameters to save (no trainable parameters?)")
    return canonical_state_dict(state)


def load_weights(model: Any, weights: Mapping[str, Any], *, adapter_only: bool = False) -> list[str]:
    """Load canonical-name weights into ``model`` however it is wrapped.

    Every saved tensor must find its parameter (else ``KeyError`` naming them). A full
    checkpoint must also cover every parameter of the model; an adapter-only one
    leaves the others alone. Returns the model keys that were loaded.
    """
    target = {canonical_name(k): k for k in model.state_dict()}
    unknown = sorted(set(weights) - set(target))
    if unknown:
        raise KeyError(f"flightlog: checkpoint weights not found in the model: {', '.join(unknown[:10])}" + (" ..." if len(unknown) > 10 else ""))
    if not adapter_only:
        missing = sorted(set(target) - set(weights))
        if missing:
            raise KeyError(f"flightlog: model parameters missing from the checkpoint: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else ""))
    mapped = {target[name]: value for name, value in weights.items()}
    result = model.load_state_dict(mapped, strict=False)
    if result.unexpected_keys:
        raise KeyError(f"flightlog: unexpected keys when loading weights: {result.unexpected_keys[:10]}")
    return sorted(mapped)


def rng_state() -> dict[str, Any]:
    """Every random generator a training step may draw from."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "cpu": torch.get_rng_state()}
    if "numpy" in sys.modules:
        import numpy as np

        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    import torch

    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["cpu"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        saved = state["cuda"]
        if len(saved) != torch.cuda.device_count():
            raise ValueError(
                f"flightlog: the checkpoint holds CUDA random states for {len(saved)} devices, this process sees "
                f"{torch.cuda.device_count()}; resume with the same CUDA_VISIBLE_DEVICES per rank"
            )
        torch.cuda.set_rng_state_all(saved)


def _as_python_state(value: Any) -> tuple[Any, ...]:
    # A state that went through a loader may come back with lists where tuples were.
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
