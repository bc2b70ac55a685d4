"""BackgroundSink: a slow store gets its own thread and a bounded backlog."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import flightlog
from flightlog.sinks._background import BackgroundSink


class GatedStore:
    """Stands in for a remote store that hangs until released (the real case is in test_sinks_mlflow)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.received: list[dict] = []
        self.closed = False

    def send(self, batch: list[dict]) -> None:
        self.entered.set()
        self.gate.wait(30)
        self.received.extend(batch)

    def close(self) -> None:
        self.closed = True


def test_write_never_waits_and_oldest_batches_are_dropped() -> None:
    store = GatedStore()
    sink = BackgroundSink(store, name="gated", max_records=50)
    started = time.monotonic()
    sink.write([{"type": "metrics", "step": j} for j in range(10)])
    assert store.entered.wait(5)
    for i in range(1, 10):
        sink.write([{"type": "metrics", "step": i * 10 + j} for j in range(10)])
    assert time.monotonic() - started < 0.5
    store.gate.set()
    sink.close()
    steps = [r["step"] for r in store.received]
    # The batch in flight when the store hung, then the newest 50 records; the rest dropped and counted.
    assert steps[:10] == list(range(10)) and steps[10:] == list(range(50, 100))
    assert sink.dropped == 40 and sink.sent == 60 and store.closed


def test_close_gives_up_after_its_timeout_and_says_what_is_missing() -> None:
    store = GatedStore()
    sink = BackgroundSink(store, name="gated", close_timeout=0.5)
    sink.write([{"type": "metrics", "step": 1}])
    assert store.entered.wait(5)
    sink.write([{"type": "metrics", "step": 2}, {"type": "metrics", "step": 3}])
    with pytest.raises(TimeoutError, match=r"gated store did not take the last 2 record\(s\) within 0.5s"):
        sink.close()
    store.gate.set()


def test_hung_store_does_not_hold_back_the_run(tmp_path: Path) -> None:
    """train.jsonl is flushed on time and finish() returns, bounded by the sink's close timeout."""
    store = GatedStore()
    sink = BackgroundSink(store, name="gated", close_timeout=1.0)
    run = flightlog.init(tmp_path, sinks=["jsonl", sink], console_stream="stderr", install_signal_handlers=False)
    for step in range(1, 51):
        run.log({"loss": 1.0 / step}, step=step)
    started = time.monotonic()
    assert run.flush(timeout=5)
    assert time.monotonic() - started < 1.0
    assert len((tmp_path / "logs" / "train.jsonl").read_bytes().splitlines()) == 51  # run_start + 50
    run.finish()
    store.gate.set()
    meta = flightlog.runfile.read_run_file(tmp_path / "logs")
    assert meta["status"] == "finished" and meta["sink_failures"] == {"gated": 1}
    # The close failure is recorded in train.jsonl itself: the stream closes after the other sinks.
    from flightlog.protocol import decode

    events = [r for r in map(decode, (tmp_path / "logs" / "train.jsonl").read_bytes().splitlines()) if r["type"] == "event"]
    assert any("sink 'gated' failed to close" in e["message"] and "not in the store" in e["message"] for e in events)


@pytest.mark.parametrize("sink, module, extra", [("tensorboard", "tensorboard", "tensorboard"), ("prometheus", "prometheus_client", "prometheus"), ("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow")])
def test_missing_package_fails_init_with_the_pip_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sink: str, module: str, extra: str) -> None:
    """An optional sink whose package is absent fails init naming the package and the extra to install."""
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a package that cannot be imported
    with pytest.raises(ImportError, match=rf"the '{sink}' sink needs the {module} package; install it with: pip install 'flightlog\[{extra}\]'"):
        flightlog.init(tmp_path, sinks=["jsonl", sink], console_stream="stderr", install_signal_handlers=False)
