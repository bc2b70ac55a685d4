"""Weight histograms as records: how LoRA A/B matrices reach TensorBoard.

A ``histograms`` record carries, per tag, the summary TensorBoard draws (the fields of
its ``HistogramProto``)::

    {"type": "histograms", "step": 100, "histograms": {
        "lora/model.layers.0.self_attn.q_proj.lora_A.default": {
            "min": -0.06, "max": 0.06, "num": 4096, "sum": 0.3, "sum_squares": 4.9,
            "bucket_limit": [-0.056, ...], "bucket": [131.0, ...]}}}

``bucket_limit[i]`` is the right edge of bucket ``i``. The summary is a few dozen
numbers a tensor, so the record is small enough for ``train.jsonl`` too.

Why this shape: the full weights never leave the device and are never copied on the
training thread. The summary is computed with device ops only (no ``.item()``, no
data-dependent histogram range), its few numbers start an asynchronous host copy, and
the writer thread reads them later, the same path a CUDA metric takes. It still costs
a pass over the adapter weights, so it runs every ``histogram_interval`` steps only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from flightlog.protocol import HISTOGRAMS
from flightlog.values import snapshot_value

if TYPE_CHECKING:
    from flightlog.run import Run

DEFAULT_BINS = 30  # TensorBoard's own default bucket count
LORA_MATCH = ("lora_A", "lora_B")


def tensor_histogram(tensor: Any, bins: int = DEFAULT_BINS) -> dict[str, Any]:
    """The histogram summary of one tensor, as (device) tensors; no host-device sync."""
    import torch

    if type(bins) is not int or not 1 <= bins <= 255:
        raise ValueError(f"flightlog: histogram bins must be an integer 1..255, got {bins!r}")
    with torch.no_grad():
        x = tensor.detach().flatten().float()
        if x.numel() == 0:
            raise ValueError("flightlog: cannot take the histogram of an empty tensor")
        low, high = x.min(), x.max()
        # A constant tensor (LoRA B starts at zero) still gets a valid, tiny range.
        span = (high - low).clamp_min(torch.finfo(torch.float32).tiny)
        # Normalising first lets histc use a fixed range: no data-dependent .item().
        counts = torch.histc((x - low) / span, bins=bins, min=0.0, max=1.0)
        edges = low + span * (torch.arange(1, bins + 1, device=x.device, dtype=torch.float32) / bins)
        return {
            "min": low,
            "max": high,
            "num": int(x.numel()),
            "sum": x.sum(),
            "sum_squares": (x * x).sum(),
            "bucket_limit": edges,
            "bucket": counts,
        }


def lora_tag(name: str) -> str:
    """``base_model.model.model.layers.0.q_proj.lora_A.default.weight`` -> ``lora/model.layers.0.q_proj.lora_A.default``."""
    for prefix in ("base_model.model.", "module."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.endswith(".weight"):
        name = name[: -len(".weight")]
    return "lora/" + name


def histogram_record(named_tensors: Iterable[tuple[str, Any]], bins: int = DEFAULT_BINS) -> dict[str, dict[str, Any]]:
    """``{tag: summary}`` with every tensor value already on its way to the host."""
    out: dict[str, dict[str, Any]] = {}
    for tag, tensor in named_tensors:
        summary = tensor_histogram(tensor, bins)
        out[tag] = {k: (v if type(v) is int else snapshot_value(v)) for k, v in summary.items()}
    return out


def log_lora_histograms(
    run: "Run",
    model: Any,
    step: int,
    *,
    every: int | None = None,
    bins: int = DEFAULT_BINS,
    match: tuple[str, ...] = LORA_MATCH,
) -> bool:
    """Record histograms of the model's LoRA A/B weights if ``step`` is on the interval.

    Call it every step (after ``optimizer.step()``); it does work only every ``every``
    steps (default: the run's ``histogram_interval``). Returns whether it recorded.
    The tensorboard sink draws the record; other sinks ignore it.
    """
    interval = run.config.histogram_interval if every is None else every
    if type(interval) is not int or interval < 1:
        raise ValueError(f"flightlog: histogram interval must be an integer >= 1, got {interval!r}")
    if step % interval:
        return False
    tensors = [(lora_tag(name), p) for name, p in model.named_parameters() if any(m in name for m in match)]
    if not tensors:
        return False
    run.record(HISTOGRAMS, step=step, histograms=histogram_record(tensors, bins))
    return True
