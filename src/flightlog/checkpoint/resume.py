"""One-command resume: the launch command is recorded when a run starts, and
``flightlog resume OUTPUT_DIR`` turns it into the command that resumes from the newest
valid checkpoint (the seeds' "bash output/resume.sh").

Two styles of training script are served. A script that resumes by itself (it uses
:class:`CheckpointManager`, or HF with :func:`flightlog.checkpoint.hf.resume_checkpoint`)
is simply launched again. A script that needs to be told (``--resume_from_checkpoint
PATH``, as ms-swift and HF examples do) is launched with that argument set to the
newest valid checkpoint; give its name as ``resume_arg``.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from flightlog.checkpoint.find import Verdict, find_latest_valid

LAUNCH_FILE = "flightlog_launch.json"
SCRIPT = "resume.sh"
ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "HF_HOME", "HF_DATASETS_CACHE", "MODELSCOPE_CACHE", "USE_HF", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
)
ENV_PREFIXES = ("FLIGHTLOG_", "NCCL_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def _recorded_env() -> dict[str, str]:
    out = {}
    for name, value in os.environ.items():
        if name in ENV_NAMES or name.startswith(ENV_PREFIXES):
            if not any(word in name.upper() for word in SECRET_WORDS):
                out[name] = value
    return out


def _launcher_argv() -> list[str] | None:
    """Under torchrun a worker's argv is the script; the command to re-run is torchrun's,
    which is the parent process's command line."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    return argv or None


def _rank() -> int:
    for name in ("RANK", "LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def launch_record(resume_arg: str | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """How this process was started: the command, its directory and environment."""
    launcher = _launcher_argv()
    command = launcher or [sys.executable, *(argv if argv is not None else sys.argv)]
    return {
        "argv": command,
        "cwd": os.getcwd(),
        "env": _recorded_env(),
        "python": sys.executable,
        "resume_arg": resume_arg,
        "launcher": "torchrun" if launcher else None,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def record_launch(
    output_dir: str | os.PathLike[str],
    *,
    run: Any = None,
    resume_arg: str | None = None,
    argv: list[str] | None = None,
) -> Path | None:
    """Write ``OUTPUT_DIR/flightlog_launch.json`` and ``OUTPUT_DIR/resume.sh`` (rank 0 only).

    ``resume_arg`` is the option the script takes to resume (``--resume_from_checkpoint``),
    or None for scripts that find their checkpoint themselves.
    """
    if resume_arg is not None and not resume_arg.startswith("-"):
        raise ValueError(f"flightlog: resume_arg must be a command-line option such as --resume_from_checkpoint, got {resume_arg!r}")
    if _rank() != 0:
        return None
    from flightlog.runfile import write_atomic

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = launch_record(resume_arg, argv)
    if run is not None:
        record["run_id"] = run.run_id
    write_atomic(out / LAUNCH_FILE, orjson.dumps(record, option=orjson.OPT_INDENT_2))
    script = out / SCRIPT
    write_atomic(script, _script_text(out, record).encode())
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    if run is not None:
        run.event(f"Resume command recorded: bash {script}", source="flightlog/checkpoint")
    return script


def _script_text(output_dir: Path, record: dict[str, Any]) -> str:
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(record["env"].items()) if name == "PYTHONPATH")
    return (
        "#!/usr/bin/env bash\n"
        f"# Written by flightlog for run {record.get('run_id', '?')} at {record['recorded']}.\n"
        "# Resumes the run from its newest valid checkpoint: bash resume.sh\n"
        "# Recorded launch command:\n"
        f"#   cd {shlex.quote(record['cwd'])} && {shlex.join(record['argv'])}\n"
        "set -euo pipefail\n"
        f"cd {shlex.quote(record['cwd'])}\n"
        f"{exports}"
        f"exec {shlex.quote(record['python'])} -m flightlog resume {shlex.quote(str(output_dir.resolve()))} --run --args \"$@\"\n"
    )


def read_launch(output_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(output_dir) / LAUNCH_FILE
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"flightlog: {path} does not exist; the run did not record its launch command "
            "(use CheckpointManager.init_run, the HF resume callback, or flightlog.checkpoint.record_launch)"
        ) from None
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"flightlog: {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("argv"), list) or not data["argv"]:
        raise ValueError(f"flightlog: {path} has no argv list")
    return data


def with_resume_arg(argv: list[str], option: str, value: str | None) -> list[str]:
    """``argv`` with every ``option X`` / ``option=X`` removed and ``option value`` appended."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == option:
            skip = True
            continue
        if arg.startswith(option + "="):
            continue
        out.append(arg)
    if value is not None:
        out += [option, value]
    return out


def resume_command(
    output_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str] | None = None
) -> tuple[list[str], dict[str, Any], Path | None, list[Verdict]]:
    """The command that resumes the run: (argv, launch record, checkpoint, skipped verdicts)."""
    launch = read_launch(output_dir)
    skipped: list[Verdict] = []
    if checkpoint is None:
        found, skipped = find_latest_valid(output_dir)
    else:
        found = Path(checkpoint)
    argv = list(launch["argv"])
    if launch.get("resume_arg"):
        argv = with_resume_arg(argv, launch["resume_arg"], str(found.resolve()) if found is not None else None)
    return argv, launch, found, skipped


def shell_line(argv: list[str], launch: dict[str, Any]) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.get("env", {}).items()))
    return f"cd {shlex.quote(launch['cwd'])} && " + (env + " " if env else "") + shlex.join(argv)


def exec_resume(argv: list[str], launch: dict[str, Any]) -> None:
    """Replace this process by the resume command, in the recorded directory and environment."""
    os.chdir(launch["cwd"])
    env = {**os.environ, **launch.get("env", {})}
    os.execvpe(argv[0], argv, env)
