"""The writer's whole-chunk path for plain numeric metrics writes exactly what the
record-by-record path writes, and steps aside for every chunk it cannot take."""

from __future__ import annotations

import json
import math
import random

import orjson
import pytest

from flightlog.pipeline.queue import PLAIN_METRICS, RecordQueue
from flightlog.pipeline.writer import Writer
from flightlog.protocol import ALERT, EVENT, METRICS
from flightlog.redact import MASK, Redactor
from flightlog.sinks.jsonl import JsonlSink


def writer(sinks=(), redactor=None, observers=()):
    return Writer(RecordQueue(100), list(sinks), run_id="r1", redactor=redactor, observers=observers)


def item(step, fields, epoch=None, kind=METRICS, t=1_765_432_100.0):
    return (kind, t + step / 1000, step, epoch, fields)


def numeric_chunk(rng: random.Random, n: int, with_epoch: bool):
    keys = ["loss", "learning_rate", "grad_norm", "tokens", "ok"]
    out = []
    for step in range(1, n + 1):
        fields = {}
        for key in rng.sample(keys, rng.randint(0, len(keys))):
            fields[key] = {"tokens": rng.randint(0, 10**6), "ok": rng.random() < 0.5}.get(key, rng.random())
        out.append(item(step, fields, epoch=step / 7 if with_epoch else None))
    return out


@pytest.mark.parametrize("with_epoch", [False, True])
def test_whole_chunk_path_equals_record_by_record(with_epoch):
    rng = random.Random(3)
    for _ in range(50):
        chunk = numeric_chunk(rng, rng.randint(1, 64), with_epoch)
        fast = writer()._finish_chunk([(k, t, s, e, dict(f)) for k, t, s, e, f in chunk])
        slow = writer()._finish_each([(k, t, s, e, dict(f)) for k, t, s, e, f in chunk])
        assert fast is not None
        assert fast == slow
        assert [orjson.dumps(r) for r in fast] == [orjson.dumps(r) for r in slow]  # same key order too


@pytest.mark.parametrize(
    "odd_item, whole_chunk",
    [
        (item(5, {"loss": math.nan}), True),  # resolved to the protocol's "NaN" first
        (item(5, {"loss": -math.inf}), True),
        (item(5, {"loss": [1.0, 2.0]}), False),
        (item(5, {"loss": {"a": 1.0}}), False),
        (item(5, {"loss": 1.0}, epoch=math.nan), False),
        (item(5, {"message": "hello"}, kind=EVENT), False),
    ],
)
def test_odd_chunks_come_out_as_record_by_record(odd_item, whole_chunk):
    chunk = [item(1, {"loss": 1.0}), odd_item, item(9, {"loss": 0.5})]
    assert (writer()._finish_chunk(copy(chunk)) is not None) == whole_chunk
    records = writer()._finish(copy(chunk))
    assert records == writer()._finish_each(copy(chunk))
    for record in records:
        json.loads(orjson.dumps(record))  # strict JSON


def test_an_epoch_on_some_records_only_goes_record_by_record():
    chunk = [item(1, {"loss": 1.0}), item(2, {"loss": 1.0}, epoch=0.5)]
    assert writer()._finish_chunk(copy(chunk)) is None
    assert writer()._finish(copy(chunk)) == writer()._finish_each(copy(chunk))


def test_whole_chunk_through_the_jsonl_sink(tmp_path):
    """Same bytes on disk as record-by-record encoding, and keys that are not strings still
    reach the file (the sink falls back to the non-string-keys encoder)."""
    sink = JsonlSink(tmp_path)
    w = writer(sinks=[sink])
    rng = random.Random(5)
    chunk = numeric_chunk(rng, 64, with_epoch=True)
    w._write(w._finish(chunk))
    w._write(w._finish([item(100, {1: 2.0, "loss": 0.25})]))
    sink.close()
    lines = (tmp_path / "train.jsonl").read_bytes().splitlines()
    assert len(lines) == 65
    expected = writer()._finish_each(numeric_chunk(random.Random(5), 64, with_epoch=True))
    assert lines[:64] == [orjson.dumps(r) for r in expected]
    assert json.loads(lines[64]) == {"type": "metrics", "timestamp": "2025-12-11T05:48:20.100Z", "run_id": "r1", "step": 100, "1": 2.0, "loss": 0.25}


def test_summary_sees_the_whole_chunk():
    w = writer()
    w._finish([item(s, {"loss": 1.0 / s, "accuracy": s / 100}) for s in range(1, 65)])
    summary = w.summary.summary()
    assert summary["last_step"] == 64
    assert summary["best"]["loss"] == {"value": 1.0 / 64, "step": 64}
    assert summary["metrics_records"] == 64


def text_chunk(rng: random.Random, n: int):
    out = []
    for step in range(1, n + 1):
        fields = {"loss": rng.random(), "stage": "warmup" if step < n // 2 else "stable", "precision": "bf16"}
        if rng.random() < 0.3:
            fields["grad_norm"] = None
        out.append(item(step, fields, epoch=step / 10))
    return out


def new_run(tmp_path, **options):
    import flightlog

    return flightlog.init(output_dir=tmp_path, install_signal_handlers=False, **options)


def finished_stream(run):
    """finish() the run, check that no sink failed, and return the records as written
    (json.loads: the protocol's "NaN"/"Infinity" strings stay strings)."""
    run.finish()
    assert run.writer.sink_failures == {}
    return [json.loads(line) for line in (run.log_dir / "train.jsonl").read_text().splitlines()]


def copy(chunk):
    return [(k, t, s, e, dict(f)) for k, t, s, e, f in chunk]


def test_flightlogs_own_strings_take_the_whole_chunk_path():
    """stage/precision strings and None values (what the collectors log) need no record-by-
    record pass: the redactor never scans those fields."""
    chunk = text_chunk(random.Random(1), 64)
    fast = writer(redactor=Redactor())._finish_chunk(copy(chunk))
    assert fast is not None
    assert fast == writer(redactor=Redactor())._finish_each(copy(chunk))


@pytest.mark.parametrize(
    "fields, redactor",
    [
        ({"loss": 1.0, "note": "key sk-abcdefghijklmnopqrstuvwx"}, Redactor()),  # a field the redactor scans
        ({"loss": 1.0, "api_token": "short"}, Redactor()),  # a secret key name
        ({"loss": 1.0, "stage": "train", "user": 7}, Redactor(hash_fields=["user"])),  # a field to hash
    ],
)
def test_text_the_redactor_may_change_goes_record_by_record(fields, redactor):
    chunk = [item(1, {"loss": 2.0, "stage": "train"}), item(2, fields)]
    assert writer(redactor=redactor)._finish_chunk(copy(chunk)) is None
    records = writer(redactor=redactor)._finish(copy(chunk))
    assert records[0] == writer(redactor=redactor)._finish_each(copy(chunk))[0]
    second = records[1]
    assert "sk-abcdefghijklmnopqrstuvwx" not in json.dumps(second)
    if "api_token" in fields:
        assert second["api_token"] == MASK
    if "user" in fields:
        assert str(second["user"]).startswith("sha256:")


def test_observers_see_each_record_and_their_records_follow_it():
    """An observer (the rules engine) sees every record of a whole chunk, in order, and
    what it emits lands right after the record that caused it, as record by record."""

    def run(method):
        seen = []
        w = writer(redactor=Redactor())

        def observer(record):
            seen.append(record["step"])
            if record["loss"] > 0.9:
                w.emit({"type": ALERT, "rule": "loss_high", "step": record["step"]})
            return record

        w.observers = [observer]
        out = getattr(w, method)(copy(text_chunk(random.Random(2), 64)))
        return seen, [(r["type"], r.get("step")) for r in out], w.summary.summary()

    fast, slow = run("_finish_chunk"), run("_finish_each")
    assert fast[0] == list(range(1, 65))
    assert any(kind == ALERT for kind, _ in fast[1])
    assert fast == slow


def test_tensors_are_resolved_and_the_chunk_stays_whole():
    torch = pytest.importorskip("torch")

    def chunk():
        return [item(s, {"loss": torch.tensor(1.0 / s), "grad_norm": torch.tensor(2.0), "stage": "stable"}) for s in range(1, 33)]

    from flightlog.values import snapshot

    snapped = [(k, t, s, e, snapshot(f)) for k, t, s, e, f in chunk()]  # what Run.log enqueues
    fast = writer(redactor=Redactor())._finish_chunk(snapped)
    assert fast is not None
    assert fast[0]["loss"] == 1.0 and type(fast[0]["grad_norm"]) is float
    slow = writer(redactor=Redactor())._finish_each([(k, t, s, e, snapshot(f)) for k, t, s, e, f in chunk()])
    assert fast == slow


def adds_cpu(record):
    record.setdefault("cpu_percent", 12.5)
    return record


def adds_secret(record):
    if record.get("step") == 3:
        record["note"] = "token sk-abcdefghijklmnopqrstuvwx leaked"
    return record


def drops_odd(record):
    return None if record.get("step", 0) % 2 else record


def raises_on_five(record):
    if record.get("step") == 5:
        raise RuntimeError("boom")
    return record


@pytest.mark.parametrize("processors", [[adds_cpu], [adds_secret], [drops_odd, adds_cpu], [raises_on_five, adds_cpu]])
def test_processors_in_the_whole_chunk_path(processors):
    """Processors see each record; what they add is redacted when it needs to be; records
    they drop are gone; a failing one is reported right after its record."""

    def run(method):
        w = writer(redactor=Redactor())
        w.processors = list(processors)
        out = getattr(w, method)(copy(text_chunk(random.Random(4), 12)))
        for record in out:
            if record["type"] == EVENT:
                record.pop("timestamp")  # made when reported
        return out, w.summary.summary()

    fast, slow = run("_finish_chunk"), run("_finish_each")
    assert fast == slow
    text = json.dumps(fast[0])
    assert "sk-abcdefghijklmnopqrstuvwx" not in text
    if processors == [raises_on_five, adds_cpu]:
        kinds = [(r["type"], r.get("step")) for r in fast[0]]
        assert kinds[5] == (EVENT, None) and kinds[4] == (METRICS, 5)


def test_items_run_log_checked_go_the_same_way():
    """Run.log marks records whose values it found plain (PLAIN_METRICS): the writer skips
    its own type check for a chunk of those, still turns NaN into the protocol's string,
    still takes text record by record, and writes them as type "metrics" either way."""
    rng = random.Random(9)
    for _ in range(30):
        chunk = numeric_chunk(rng, rng.randint(1, 64), with_epoch=rng.random() < 0.5)
        checked = [(PLAIN_METRICS, t, s, e, f) for _, t, s, e, f in chunk]
        if rng.random() < 0.5:  # some records unchecked: a mixed chunk
            checked = [c if rng.random() < 0.5 else (METRICS, *c[1:]) for c in checked]
        if rng.random() < 0.3:
            checked[rng.randrange(len(checked))][4]["loss"] = rng.choice([math.nan, math.inf, "text", None])
        assert writer()._finish(copy(checked)) == writer()._finish_each(copy(chunk_as_metrics(checked)))
    out = writer()._finish(copy([(PLAIN_METRICS, 1.0, 1, None, {"loss": math.nan}), (EVENT, 1.0, None, None, {"message": "m"})]))
    assert [r["type"] for r in out] == [METRICS, EVENT] and out[0]["loss"] == "NaN"


def chunk_as_metrics(chunk):
    return [(METRICS if k == PLAIN_METRICS else k, t, s, e, f) for k, t, s, e, f in chunk]


def test_run_log_marks_only_plain_records(tmp_path):
    """What Run.log enqueues: PLAIN_METRICS for plain Python values, METRICS when a value
    needed a snapshot or a hook may have added anything; all reach the file as metrics."""
    run = new_run(tmp_path, sinks=["jsonl"], rules=False)
    seen = []
    run.queue._items = _Spy(run.queue._items, seen)
    run._items = run.queue._items
    np = pytest.importorskip("numpy")
    run.log({"loss": 1.0, "stage": "stable", "x": None}, step=1)
    run.log({"loss": np.float32(0.5)}, step=2)
    run.on_log(lambda metrics, step: {"extra": 1.0})
    run.log({"loss": 0.25}, step=3)
    records = finished_stream(run)
    assert seen == [PLAIN_METRICS, METRICS, METRICS]
    metrics = [r for r in records if r["type"] == METRICS]
    assert [(r["step"], r["loss"]) for r in metrics] == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert metrics[2]["extra"] == 1.0


class _Spy:
    """The run's deque, noting the kind of each metrics item appended."""

    def __init__(self, items, seen):
        self._items, self._seen = items, seen

    def append(self, item):
        if item[0] in (METRICS, PLAIN_METRICS):
            self._seen.append(item[0])
        self._items.append(item)

    def __getattr__(self, name):
        return getattr(self._items, name)

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)


def test_an_integer_beyond_the_float_range_is_refused_by_name(tmp_path):
    """sum() over 10**400 and a float raises OverflowError: that must not cost the chunk (it
    once lost run_start and every record beside it). The value is dropped with a message
    naming its key; a big integer within the float range is written as a float."""
    run = new_run(tmp_path, sinks=["jsonl"], rules=False)
    run.log({"loss": 0.5, "huge": 10**400}, step=1)
    run.log({"loss": 0.25, "big": 10**30, "huge": -(10**400)}, step=2)
    run.log({"loss": 0.125, "nested": [1, 10**400]}, step=3)
    records = finished_stream(run)
    assert records[0]["type"] == "run_start" and records[-1]["type"] == "run_end"
    metrics = [{k: v for k, v in r.items() if k not in ("type", "timestamp", "run_id")} for r in records if r["type"] == METRICS]
    assert metrics == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25, "big": 1e30}, {"step": 3, "loss": 0.125}]
    warnings = [r["message"] for r in records if r["type"] == EVENT and r["source"] == "flightlog/values"]
    assert any("'huge'" in m and "beyond the range of a float" in m for m in warnings)
    assert any("'nested[1]'" in m for m in warnings)
    assert not [r for r in records if r["type"] == EVENT and r["level"] == "ERROR"]


def test_an_epoch_of_any_kind_never_costs_the_batch(tmp_path):
    """A numpy epoch once made the JSONL sink refuse the whole batch (run_start and every
    record beside it). Numbers of any kind are written as numbers, a non-finite one as the
    protocol's string; a non-number is dropped by name and the record kept."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    run = new_run(tmp_path, sinks=["jsonl"], rules=False)
    epochs = [0.1, np.float32(0.25), torch.tensor(0.5), math.inf, "one", 2]
    for step, epoch in enumerate(epochs, start=1):
        run.log({"loss": 1.0 / step}, step=step, epoch=epoch)
    run.event("checkpoint saved", epoch=np.float64(1.5))
    records = finished_stream(run)
    assert records[0]["type"] == "run_start"
    metrics = [r for r in records if r["type"] == METRICS]
    assert [r["step"] for r in metrics] == [1, 2, 3, 4, 5, 6]
    assert [r.get("epoch") for r in metrics] == [0.1, 0.25, 0.5, "Infinity", None, 2]
    assert any(r["type"] == EVENT and r.get("epoch") == 1.5 for r in records)
    assert any(r["type"] == EVENT and "epoch: must be a number, got 'one'" in r["message"] for r in records)


def test_a_record_the_writer_cannot_finish_costs_only_itself():
    """An item that makes finishing raise (here a corrupt time: only a flightlog bug could
    queue one) is dropped and reported; the rest of its chunk is written."""
    w = writer()
    chunk = [item(1, {"loss": 1.0}), ("metrics", "not a time", 2, None, {"loss": 0.5}), item(3, {"loss": 0.25})]
    out = w._finish(copy(chunk))
    assert [(r["type"], r.get("step")) for r in out] == [(METRICS, 1), (METRICS, 3), (EVENT, None)]
    assert "could not write a 'metrics' record (step 2)" in out[-1]["message"]


def test_a_key_the_encoder_cannot_write_is_written_as_text(tmp_path):
    """A tuple key once made the JSONL sink refuse the batch and finish() raise (run.json
    holds the summary): it is written as its str(); int keys stay as orjson writes them."""
    run = new_run(tmp_path, sinks=["jsonl", "csv"])
    run.log({"loss": 0.5}, step=1)
    run.log({(1, 2): 0.25, "loss": 0.2, 3: 1.0}, step=2)
    run.log({"loss": 0.125}, step=3)
    records = finished_stream(run)
    metrics = [r for r in records if r["type"] == METRICS]
    assert [r["loss"] for r in metrics] == [0.5, 0.2, 0.125]
    assert metrics[1]["(1, 2)"] == 0.25 and metrics[1]["3"] == 1.0
    assert records[-1]["type"] == "run_end" and records[-1]["summary"]["last"]["(1, 2)"] == 0.25


def test_text_that_is_not_utf8_is_escaped_not_fatal(tmp_path, capsys):
    """A lone surrogate (a file name decoded with surrogateescape) once made every sink
    refuse the batch and finish() raise: it is written as its backslash escape."""
    name = b"ckpt-\xff.bin".decode("utf-8", "surrogateescape")
    run = new_run(tmp_path, sinks=["jsonl", "csv", "console"])
    run.log({"loss": 0.5}, step=1)
    run.log({"loss": 0.25, "file": name, name: 1.0}, step=2)
    run.event(f"saved {name}", path=name)
    run.log({"loss": 0.125}, step=3)
    records = finished_stream(run)
    metrics = [r for r in records if r["type"] == METRICS]
    assert [r["loss"] for r in metrics] == [0.5, 0.25, 0.125]
    assert metrics[1]["file"] == "ckpt-\\udcff.bin" and metrics[1]["ckpt-\\udcff.bin"] == 1.0
    assert any(r["type"] == EVENT and r.get("path") == "ckpt-\\udcff.bin" for r in records)
    assert "ckpt-\\udcff.bin" in (run.log_dir / "metrics.csv").read_text()
    assert "saved ckpt-\\udcff.bin" in capsys.readouterr().out
