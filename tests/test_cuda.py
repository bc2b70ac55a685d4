"""CUDA tensors are logged without a host-device synchronisation on the training thread.

Skipped without a CUDA device; run on the GPU machine with
``pytest tests/test_cuda.py`` (see docs/benchmarks.md for the measured cost).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_logging_cuda_tensors_never_syncs(tmp_path):
    """A training loop under sync_debug_mode('error') logs CUDA loss and grad norm every step;
    the values on disk equal the ones computed on the device."""
    import flightlog

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randn(64, 1, device="cuda")
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False)
    kept_loss, kept_norm = [], []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 201):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            run.log({"loss": loss.detach(), "grad_norm": norm}, step=step)
            kept_loss.append(loss.detach().clone())
            kept_norm.append(norm.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    run.finish()
    frame = flightlog.load(run)
    expected_loss = torch.stack(kept_loss).cpu().tolist()
    expected_norm = torch.stack(kept_norm).cpu().tolist()
    assert frame["loss"].tolist() == pytest.approx(expected_loss, rel=0, abs=0)
    assert frame["grad_norm"].tolist() == pytest.approx(expected_norm, rel=0, abs=0)
