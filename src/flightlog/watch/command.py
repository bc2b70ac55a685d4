"""``flightlog watch -- COMMAND ARGS...``: run a training command unchanged and record
what it prints as a flightlog run.

The command's stdout and stderr are passed through byte for byte (to our stdout and
stderr); a copy of each is parsed by the text templates (HF's printed log dicts, with
the step from its progress bar; ms-swift's dicts; the seeds' ``Step 45/500 | ...``
lines). ``PYTHONUNBUFFERED=1`` is set for the command so that a Python trainer's prints
arrive as they happen rather than in 8 KiB blocks. The run's log goes to
``OUTPUT_DIR/logs`` when the command names ``--output_dir``, else
``./flightlog-watch/<name>``. The run ends ``finished`` on exit code 0, ``interrupted``
on SIGINT/SIGTERM, ``failed`` otherwise; the command's exit code is returned.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Sequence

from flightlog.store.importers.base import Importer, Record
from flightlog.store.importers.text import ConsoleParser, RegexTemplate, SegmentSplitter
from flightlog.watch.console import StreamState, alert_console
from flightlog.watch.feed import ProcessorFactory, RunFeeder

_OUTPUT_FLAGS = ("--output_dir", "--output-dir", "--output")


class CommandOutput(Importer):
    """The importer side of a watched command: counts skips, builds run_start."""

    format = "console"

    def __init__(self, argv: Sequence[str], name: str) -> None:
        super().__init__(Path.cwd())
        self.argv = list(argv)
        self.name = name

    def _start(self) -> Record:
        record = super()._start()
        record.update(run_name=self.name, source_path=" ".join(self.argv))
        return record


def output_dir_of(argv: Sequence[str]) -> str | None:
    """The ``--output_dir`` the command was given (``--output_dir X`` or ``--output_dir=X``)."""
    for i, arg in enumerate(argv):
        for flag in _OUTPUT_FLAGS:
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def command_name(argv: Sequence[str]) -> str:
    """A run name from the command: the script's name (``train`` for ``python train.py``)."""
    for arg in argv[1:] if len(argv) > 1 else argv:
        if not arg.startswith("-"):
            return Path(arg).stem or "run"
    return Path(argv[0]).stem or "run"


def _pump(source: BinaryIO, sink: Any, stream: str, out: "queue.Queue[tuple[str, bytes | None]]", state: StreamState | None = None) -> None:
    """Copy the child's bytes to our stream unchanged, and a copy to the parser queue."""
    fd = source.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            try:
                sink.write(data)
                sink.flush()
                if state is not None:
                    state.saw(data)
            except (OSError, ValueError):
                pass  # our own stdout closed: keep recording anyway
            out.put((stream, data))
    finally:
        out.put((stream, None))


def _binary(stream: Any) -> Any:
    return getattr(stream, "buffer", None) or _TextSink(stream)


class _TextSink:
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode("utf-8", "replace"))

    def flush(self) -> None:
        self.stream.flush()


def watch_command(
    argv: Sequence[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
    run_name: str | None = None,
    patterns: Iterable[str] = (),
    processors: Iterable[ProcessorFactory] = (),
    options: dict[str, Any] | None = None,
    sinks: list[Any] | None = None,
    pair_timeout: float = 1.5,
) -> int:
    """Run ``argv``, pass its output through, record it; returns its exit code."""
    if not argv:
        raise ValueError("flightlog watch: no command given after '--'")
    name = run_name or command_name(argv)
    out_dir = output_dir_of(argv)
    target = Path(log_dir) if log_dir else (Path(out_dir) / "logs" if out_dir else Path("flightlog-watch") / name)
    templates = [RegexTemplate(p) for p in patterns]  # a bad pattern fails before the command starts

    stderr_state = StreamState()
    source = CommandOutput(argv, name)
    parser = ConsoleParser(source, templates, pair_timeout=pair_timeout)
    feeder = RunFeeder(
        output_dir=out_dir or Path.cwd(),
        log_dir=target,
        sinks=sinks if sinks is not None else ["jsonl", alert_console(stderr_state)],
        processors=processors,
        options=options,
        run_name=name,
        config={"command": list(argv)},
    )
    feeder.feed(next(iter(source.records())))

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        feeder.finish("failed", {"reason": f"could not start {argv[0]!r}: {exc.strerror or exc}"})
        print(f"flightlog watch: could not start {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127

    chunks: "queue.Queue[tuple[str, bytes | None]]" = queue.Queue()
    pumps = [
        threading.Thread(target=_pump, args=(child.stdout, _binary(sys.stdout), "stdout", chunks), daemon=True),
        threading.Thread(target=_pump, args=(child.stderr, _binary(sys.stderr), "stderr", chunks, stderr_state), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    previous_term = _forward_sigterm(child)

    splitters = {"stdout": SegmentSplitter(), "stderr": SegmentSplitter()}
    open_streams = 2

    def handle(records: list[Record]) -> None:
        for record in records:
            feeder.feed(record)
        feeder.set_max_steps(parser.max_steps)

    def take(stream: str, segments: list[tuple[str, int]]) -> None:
        for segment, line in segments:
            handle(source._take(parser.feed(segment, f"{stream}:{line}")))

    try:
        while open_streams:
            try:
                try:
                    stream, data = chunks.get(timeout=0.2)
                except queue.Empty:
                    handle(source._take(parser.tick()))
                    continue
                if data is None:
                    open_streams -= 1
                    take(stream, splitters[stream].close())
                    continue
                take(stream, splitters[stream].feed(data))
            except KeyboardInterrupt:
                # Ctrl-C reached the command too (same process group); this makes sure.
                # Keep recording until it has exited.
                _signal(child, signal.SIGINT)
        code = _wait(child)
        handle(source._take(parser.finish()))
    finally:
        _restore_sigterm(previous_term)
        if child.poll() is None:
            child.kill()
            child.wait()
    rc = child.returncode
    if rc == 0:
        status = "finished"
    elif rc in (-signal.SIGINT, -signal.SIGTERM, 130, 143):
        status = "interrupted"
    else:
        status = "failed"
    feeder.finish(status, {"exit_code": rc, "import": source.stats.as_dict()})
    return code


def _wait(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            rc = child.wait()
            break
        except KeyboardInterrupt:
            _signal(child, signal.SIGINT)
    return 128 - rc if rc < 0 else rc


def _signal(child: subprocess.Popen[bytes], signum: int) -> None:
    if child.poll() is None:
        try:
            child.send_signal(signum)
        except OSError:
            pass


def _forward_sigterm(child: subprocess.Popen[bytes]) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGTERM, lambda signum, frame: _signal(child, signal.SIGTERM))
    except (ValueError, OSError):
        return None


def _restore_sigterm(previous: Any) -> None:
    if previous is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        signal.signal(signal.SIGTERM, previous)
    except (ValueError, OSError, TypeError):
        pass
