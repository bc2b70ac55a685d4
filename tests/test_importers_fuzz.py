"""Fuzzing the importers with hypothesis: whatever a file holds, reading it never raises,
and what comes out is protocol-shaped (integer steps, numeric metric values)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightlog.store.importers.base import Importer
from flightlog.store.importers.hf import TrainerStateImporter
from flightlog.store.importers.swift import SwiftImporter
from flightlog.store.importers.tail import LineTail
from flightlog.store.importers.tensorboard import TensorBoardImporter
from flightlog.store.importers.text import ConsoleParser, TextImporter

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SWIFT_KEYS = ["loss", "grad_norm", "learning_rate", "memory(GiB)", "train_speed(iter/s)", "train_speed(s/it)", "epoch",
              "global_step/max_steps", "global_step", "elapsed_time", "remaining_time", "percentage", "eval_loss",
              "train_runtime", "last_model_checkpoint", "best_metric", "acc"]
values = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.from_regex(r"\A-?\d{1,4}/\d{1,4}\Z"), st.from_regex(r"\A\d+h \d+m \d+s\Z"),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
swift_objects = st.dictionaries(st.sampled_from(SWIFT_KEYS) | st.text(max_size=8), values, max_size=8)


def check_records(records: list[dict]) -> None:
    for r in records:
        assert r["type"] in ("run_start", "metrics", "event", "checkpoint", "run_end"), r
        if r["type"] == "metrics":
            assert type(r.get("step")) is int and r["step"] >= 0, r
            for key, value in r.items():
                if key not in ("type", "timestamp", "step", "epoch"):
                    assert type(value) in (int, float), (key, value)
            if "epoch" in r:
                assert math.isfinite(r["epoch"])


def write(tmp: str, name: str, data: bytes) -> Path:
    path = Path(tmp) / name
    path.write_bytes(data)
    return path


@FUZZ
@given(st.lists(st.one_of(swift_objects.map(lambda o: json.dumps(o).encode()), st.binary(max_size=40)), max_size=12), st.booleans())
def test_swift_never_raises(lines: list[bytes], newline_at_end: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
        path = write(tmp, "logging.jsonl", data)
        imp = SwiftImporter(path)
        check_records(list(imp.records()))
        assert sum(imp.stats.skipped.values()) <= data.count(b"\n") + 1


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["log_history", "step", "loss", "eval_loss", "global_step", "max_steps", "best_model_checkpoint", "train_runtime", "epoch"]), inner, max_size=5),
                    max_leaves=25),
       st.binary(max_size=30))
def test_trainer_state_never_raises(state: object, junk: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp, "trainer_state.json", json.dumps(state).encode())
        check_records(list(TrainerStateImporter(Path(tmp)).records()))
        write(tmp, "trainer_state.json", junk)
        check_records(list(TrainerStateImporter(Path(tmp) / "trainer_state.json").records()))


text_lines = st.one_of(
    st.text(max_size=80),
    st.builds(lambda s, m, l, rest: f"Step {s}/{m} | loss {l} | {rest}", st.integers(0, 10**6), st.integers(0, 10**6), st.floats() | st.text(max_size=5), st.text(max_size=20)),
    st.builds(lambda d: repr(d), st.dictionaries(st.sampled_from(["loss", "epoch", "learning_rate", "global_step/max_steps", "train_runtime"]) | st.text(max_size=4), values, max_size=5)),
    st.builds(lambda n, t: f"\r{n}/{t} [00:01<00:02]\r   \r", st.integers(0, 99), st.integers(0, 99)),
    st.builds(lambda lvl, msg: f"[2024-09-12 14:22:03,187] [{lvl}] [x.py:1] {msg}", st.text(max_size=8), st.text(max_size=20)),
)


@FUZZ
@given(st.lists(text_lines, max_size=15))
def test_console_parser_never_raises(lines: list[str]) -> None:
    imp = Importer(Path("."))
    parser = ConsoleParser(imp, pair_timeout=0)
    out = []
    for i, line in enumerate(lines):
        out.extend(parser.feed(line, str(i)))
    out.extend(parser.finish())
    check_records(out)


@FUZZ
@given(st.lists(text_lines, max_size=10), st.binary(max_size=50))
def test_text_file_never_raises(lines: list[str], junk: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = write(tmp, "train.log", "\n".join(lines).encode("utf-8", "surrogatepass") + junk)
        check_records(list(TextImporter(path, patterns=[r"it=(?P<step>\S+) loss=(?P<loss>\S+)"]).records()))


@FUZZ
@given(st.binary(max_size=64), st.integers(0, 200))
def test_tensorboard_never_raises(junk: bytes, cut: int) -> None:
    """Random bytes, and a real event file cut anywhere with junk after it."""
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp, "events.out.tfevents.1.junk", junk)
        check_records(list(TensorBoardImporter(Path(tmp)).records()))
        real = _event_file_bytes()
        write(tmp, "events.out.tfevents.1.junk", real[: len(real) - cut] + junk)
        check_records(list(TensorBoardImporter(Path(tmp)).records()))


_EVENT_BYTES: list[bytes] = []


def _event_file_bytes() -> bytes:
    if not _EVENT_BYTES:
        from torch.utils.tensorboard import SummaryWriter

        with tempfile.TemporaryDirectory() as tmp:
            with SummaryWriter(tmp) as w:
                for step in range(1, 4):
                    w.add_scalar("train/loss", 1.0 / step, step)
                    w.add_scalar("eval/loss", 2.0, step)
            _EVENT_BYTES.append(next(Path(tmp).glob("events*")).read_bytes())
    return _EVENT_BYTES[0]


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(1, 300), max_size=10))
def test_tail_reassembles_lines_however_the_writes_are_cut(data: bytes, cuts: list[int]) -> None:
    """Lines come out exactly as written, whatever the chunks the writer appended."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write(tmp, "f.log", b"")
        tail = LineTail(path)
        got: list[bytes] = []
        points = sorted({0, len(data), *[c for c in cuts if c < len(data)]})
        for a, b in zip(points, points[1:]):
            with open(path, "ab") as fh:
                fh.write(data[a:b])
            got.extend(tail.read_lines())
        got.extend(tail.read_lines())
        assert got == data.split(b"\n")[:-1]
        assert tail.take_partial() == data.split(b"\n")[-1]
