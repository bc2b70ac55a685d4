"""Weights under canonical names: adapter-only checkpoints saved from a wrapped model
(DDP, torch.compile, FSDP-style prefixes) load into a differently wrapped one; bad
inputs fail with messages naming what was wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from flightlog.checkpoint import CheckpointManager
from flightlog.checkpoint.state import canonical_name, load_weights, model_weights


def lora_model(seed: int) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"], init_lora_weights=False))
    return model


@pytest.fixture()
def ddp_group(tmp_path: Path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_canonical_names() -> None:
    """Wrapper segments vanish wherever they are; look-alike names stay."""
    assert canonical_name("module._orig_mod.layers.0._fsdp_wrapped_module.weight") == "layers.0.weight"
    assert canonical_name("_checkpoint_wrapped_module.mlp.weight") == "mlp.weight"
    assert canonical_name("submodule.module_list.0.weight") == "submodule.module_list.0.weight"


@pytest.mark.slow
def test_adapter_saved_from_ddp_loads_into_plain_model(tmp_path: Path, ddp_group) -> None:
    """A LoRA adapter checkpointed from DDP(torch.compile(peft model)) loads into a plain peft model built with another seed; the backbone is untouched."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    source = lora_model(seed=1)
    wrapped = DDP(torch.compile(source))
    assert any(k.startswith("module._orig_mod.") for k in wrapped.state_dict())
    mgr = CheckpointManager(tmp_path, model=wrapped, save_steps=1, adapter_only=True)
    path = mgr.save(1)
    saved = torch.load(path / "adapter_model.bin", weights_only=True)
    assert saved and all("lora_" in k and not k.startswith(("module.", "_orig_mod.")) for k in saved)
    assert not (path / "pytorch_model.bin").exists()

    target = lora_model(seed=2)
    backbone_before = {k: v.clone() for k, v in target.state_dict().items() if "lora_" not in k}
    CheckpointManager(tmp_path, model=target, save_steps=1).restore(path)
    src = {canonical_name(k): v for k, v in source.state_dict().items()}
    for key, value in target.state_dict().items():
        if "lora_" in key:
            assert torch.equal(value, src[key]), key
        else:
            assert torch.equal(value, backbone_before[key]), f"backbone weight {key} changed"


def test_full_weights_from_compiled_into_fsdp_style_names(tmp_path: Path) -> None:
    """Full weights saved from a torch.compile model load into a model whose names carry FSDP wrapper segments."""
    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    weights = model_weights(torch.compile(source))

    class Wrapped(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._fsdp_wrapped_module = inner

    torch.manual_seed(9)
    target = Wrapped(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1)))
    loaded = load_weights(target, weights)
    assert loaded[0].startswith("_fsdp_wrapped_module.")
    for (_, a), (_, b) in zip(sorted(source.state_dict().items()), sorted(target._fsdp_wrapped_module.state_dict().items())):
        assert torch.equal(a, b)


def test_mismatched_weights_name_the_keys() -> None:
    """Unknown saved keys, and for full checkpoints missing ones, raise KeyError naming them."""
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(KeyError, match="9.weight"):
        load_weights(model, {"9.weight": torch.zeros(2, 2)}, adapter_only=True)
    with pytest.raises(KeyError, match="0.bias"):
        load_weights(model, {"0.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="no parameters"):
        model.requires_grad_(False)
        model_weights(model, adapter_only=True)


def test_manager_rejects_bad_arguments(tmp_path: Path) -> None:
    """save_steps, save_total_limit and state objects are checked at construction."""
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="save_steps"):
        CheckpointManager(tmp_path, model=model, save_steps=0)
    with pytest.raises(ValueError, match="save_total_limit"):
        CheckpointManager(tmp_path, model=model, save_steps=1, save_total_limit=0)
    with pytest.raises(TypeError, match="optimizer"):
        CheckpointManager(tmp_path, model=model, save_steps=1, optimizer=object())


def test_restore_refuses_invalid_checkpoint(tmp_path: Path) -> None:
    """Restoring an explicitly named but corrupt checkpoint raises and says why; nothing is loaded."""
    model = nn.Linear(2, 2)
    mgr = CheckpointManager(tmp_path, model=model, save_steps=1)
    path = mgr.save(1)
    with open(path / "pytorch_model.bin", "r+b") as fh:
        fh.seek(40)
        fh.write(b"\0\0\0\0")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="sha256"):
        CheckpointManager(tmp_path, model=model, save_steps=1).restore(path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(FileNotFoundError, match="no valid checkpoint"):
        CheckpointManager(tmp_path, model=model, save_steps=1).restore()


class ResumableCounterLoader:
    """A loader that resumes itself (the StatefulDataLoader protocol: state_dict/load_state_dict)."""

    def __init__(self, n: int) -> None:
        self.n, self.pos = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        while self.pos < self.n:
            self.pos += 1
            yield torch.tensor([float(self.pos)])
        self.pos = 0

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def test_stateful_loader_and_extra_state_round_trip(tmp_path: Path) -> None:
    """A loader with its own state_dict is saved and restored by it (no batch skipping); extra stateful objects come back too."""
    model = nn.Linear(1, 1)
    loader = ResumableCounterLoader(10)
    ema = torch.optim.swa_utils.AveragedModel(model)
    mgr = CheckpointManager(tmp_path, model=model, save_steps=3, data_loader=loader, extra={"ema": ema})
    seen = []
    for step, batch in enumerate(mgr.epoch_batches(loader, 0), start=1):
        seen.append(batch.item())
        ema.update_parameters(model)
        mgr.step(step)
        if step == 4:
            break
    loader2, ema2 = ResumableCounterLoader(10), torch.optim.swa_utils.AveragedModel(nn.Linear(1, 1))
    mgr2 = CheckpointManager(tmp_path, model=nn.Linear(1, 1), save_steps=3, data_loader=loader2, extra={"ema": ema2})
    position = mgr2.restore()
    assert (position.global_step, position.epoch, position.batches_consumed) == (3, 0, 3)
    assert [b.item() for b in mgr2.epoch_batches(loader2, 0)] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert int(ema2.n_averaged) == 3
