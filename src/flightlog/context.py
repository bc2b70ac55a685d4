"""The run's context for ``run_start`` and ``run.json``: host, hardware, code, command.

Gathered once at ``init``. torch is consulted only if the program already imported
it (flightlog never imports torch for this), so ``import flightlog`` stays light.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def accelerator_info() -> dict[str, Any]:
    """Accelerator model, count and memory, if torch is loaded and sees a device."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"type": "cpu", "count": 0}
    try:
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            props = torch.cuda.get_device_properties(0)
            info: dict[str, Any] = {
                "type": "cuda",
                "count": count,
                "model": props.name,
                "memory_mb": round(props.total_memory / 2**20),
                "capability": f"{props.major}.{props.minor}",
                "cuda_version": torch.version.cuda,
            }
            return info
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return {"type": "mps", "count": 1}
    except Exception as exc:  # a broken driver must not stop init
        return {"type": "unknown", "count": 0, "error": f"{type(exc).__name__}: {exc}"}
    return {"type": "cpu", "count": 0}


def distributed_info() -> dict[str, Any]:
    """World size, rank and node from the launcher's environment (torchrun, SLURM...)."""
    env = os.environ
    world = env.get("WORLD_SIZE") or env.get("SLURM_NTASKS")
    rank = env.get("RANK") or env.get("SLURM_PROCID")
    info: dict[str, Any] = {"world_size": int(world) if world and world.isdigit() else 1}
    if rank and rank.isdigit():
        info["rank"] = int(rank)
    local = env.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit():
        info["local_world_size"] = int(local)
        info["nodes"] = max(1, info["world_size"] // int(local))
    if env.get("MASTER_ADDR"):
        info["master_addr"] = env["MASTER_ADDR"]
    return info


def hardware_info() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_mb": round(m / 2**20) if (m := _memory_bytes()) else None,
        "accelerator": accelerator_info(),
        **distributed_info(),
    }


def code_version(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The git commit (and whether the tree has changes) of the directory the run starts in."""
    cwd = Path(directory or os.getcwd())
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2
        )
        if commit.returncode != 0:
            return {}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=2
        )
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def launch_command() -> dict[str, Any]:
    """How this process was started, so the run can be resumed with the same command."""
    argv = list(sys.argv)
    exe = sys.executable
    return {
        "argv": argv,
        "executable": exe,
        "cwd": os.getcwd(),
        "command": shlex.join([exe, *argv]) if argv and argv[0] else None,
    }


def versions() -> dict[str, str]:
    from flightlog import __version__

    out = {"flightlog": __version__, "python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "accelerate", "lightning", "deepspeed", "swift"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            out[name] = str(module.__version__)
    return out
