"""The writer's whole-chunk path for plain numeric metrics writes exactly what the
record-by-record path writes, and steps aside for every chunk it cannot take."""

from __future__ import annotations

import json
import math
import random

import orjson
import pytest

from flightlog.pipeline.queue import RecordQueue
from flightlog.pipeline.writer import Writer
from flightlog.protocol import EVENT, METRICS
from flightlog.sinks.jsonl import JsonlSink


def writer(tmp_path=None, sinks=()):
    return Writer(RecordQueue(100), list(sinks), run_id="r1")


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
        fast = writer()._finish_numbers([(k, t, s, e, dict(f)) for k, t, s, e, f in chunk])
        slow = writer()._finish_each([(k, t, s, e, dict(f)) for k, t, s, e, f in chunk])
        assert fast is not None
        assert fast == slow
        assert [orjson.dumps(r) for r in fast] == [orjson.dumps(r) for r in slow]  # same key order too


@pytest.mark.parametrize(
    "odd_item",
    [
        item(5, {"loss": math.nan}),
        item(5, {"loss": math.inf}),
        item(5, {"loss": "high"}),
        item(5, {"loss": None}),
        item(5, {"loss": [1.0, 2.0]}),
        item(5, {"loss": 1.0}, epoch=0.5),  # mixed: some records with an epoch, some without
        item(5, {"loss": 1.0}, epoch=math.nan),
        item(5, {"message": "hello"}, kind=EVENT),
    ],
)
def test_chunks_it_cannot_take_go_record_by_record(odd_item):
    chunk = [item(1, {"loss": 1.0}), odd_item, item(9, {"loss": 0.5})]
    if odd_item[3] is not None and not math.isnan(odd_item[3]):
        chunk = [item(1, {"loss": 1.0}), odd_item]  # an epoch on one record only
    assert writer()._finish_numbers(chunk) is None
    records = writer()._finish(chunk)
    assert len(records) == len(chunk)
    for record in records:
        json.loads(orjson.dumps(record))  # finished into strict JSON all the same


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
