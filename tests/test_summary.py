"""The run summary: batch observing gives what observing one record at a time gives."""

from __future__ import annotations

import json
import math
import random

from flightlog.pipeline.summary import SummaryTracker
from flightlog.protocol import metric_goal


def reference(records):
    """The summary by its definition, one record at a time."""
    last, best, best_step, last_step = {}, {}, {}, None
    for record in records:
        last.update(record)
        if record.get("step") is not None:
            last_step = record["step"]
        for key, value in record.items():
            goal = metric_goal(key)
            if not goal or type(value) not in (int, float) or value != value:
                continue
            if key not in best or (value < best[key] if goal < 0 else value > best[key]):
                best[key], best_step[key] = value, record.get("step")
    return last, best, best_step, last_step


def random_records(rng: random.Random, n: int):
    names = ["loss", "eval_loss", "accuracy", "learning_rate", "grad_norm", "note"]
    records = []
    for step in range(1, n + 1):
        record = {"type": "metrics", "timestamp": "t", "run_id": "r"}
        if rng.random() > 0.1:
            record["step"] = step
        for name in rng.sample(names, rng.randint(1, len(names))):
            roll = rng.random()
            if name == "note" or roll < 0.05:
                record[name] = rng.choice(["NaN", "text", None, True])
            elif roll < 0.1:
                record[name] = math.nan
            else:
                record[name] = rng.choice([rng.randint(0, 3), round(rng.random(), 1)])  # many ties
        records.append(record)
    return records


def test_batches_match_one_by_one():
    rng = random.Random(7)
    for trial in range(200):
        records = random_records(rng, rng.randint(1, 150))
        tracker = SummaryTracker()
        i = 0
        while i < len(records):
            size = rng.choice([1, 3, 64])
            tracker.observe_batch(records[i : i + size])
            i += size
        last, best, best_step, last_step = reference(records)
        assert tracker.metrics_records == len(records)
        assert tracker.last_step == last_step, trial
        assert {k: v for k, v in tracker.last.items() if not (isinstance(v, float) and math.isnan(v))} == {
            k: v for k, v in last.items() if not (isinstance(v, float) and math.isnan(v))
        }, trial
        assert tracker.last.keys() == last.keys()
        assert tracker.best == best, trial
        assert tracker.best_step == best_step, trial


def test_fields_with_steps_beside_them_match_whole_records():
    """The writer's fast path hands the summary only the metric fields, steps beside them."""
    rng = random.Random(8)
    for trial in range(100):
        records = [r for r in random_records(rng, rng.randint(1, 150)) if "step" in r]
        whole, split = SummaryTracker(), SummaryTracker()
        for i in range(0, len(records), 64):
            batch = records[i : i + 64]
            whole.observe_batch(batch)
            split.observe_batch(tuple({k: v for k, v in r.items() if k not in ("type", "timestamp", "run_id", "step")} for r in batch), tuple(r["step"] for r in batch))
        assert json.dumps(split.summary(), sort_keys=True) == json.dumps(whole.summary(), sort_keys=True), trial  # (NaN equals NaN)


def test_same_keys_every_step_takes_the_last_record():
    tracker = SummaryTracker()
    tracker.observe_batch([{"type": "metrics", "step": s, "loss": 1.0 / s, "accuracy": s / 10} for s in range(1, 65)])
    summary = tracker.summary()
    assert summary["last_step"] == 64
    assert summary["last"] == {"loss": 1.0 / 64, "accuracy": 6.4}
    assert summary["best"] == {"loss": {"value": 1.0 / 64, "step": 64}, "accuracy": {"value": 6.4, "step": 64}}
