"""A small sample of the quality benchmark (bench/rules_quality.py) as a regression test."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "rules_quality.py"


@pytest.mark.slow
def test_sample_meets_the_goals() -> None:
    """24 labelled runs (two of each kind): every injected fault found, no false alert on clean steps,
    and the fixed-threshold baseline is worse on both counts."""
    spec = importlib.util.spec_from_file_location("rules_quality", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.modules.pop(spec.name, None)
    rng = random.Random(7)
    runs = [bench.generate(kind, rng) for kind in bench.KINDS for _ in range(2)]
    ours, base = bench.score(runs, baseline=False), bench.score(runs, baseline=True)
    faults = sum(ours["faults"].values())
    assert faults == 20
    assert sum(ours["detected"].values()) == faults
    assert ours["clean_false"] == 0
    assert base["clean_false"] > 10 and sum(base["detected"].values()) < faults
