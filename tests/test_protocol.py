"""The log protocol: timestamps, strict JSON, non-finite numbers, supersession."""

from __future__ import annotations

import json
import math
import re
import subprocess

import pytest

from flightlog import protocol
from tests.conftest import have_jq


class TestTimestamps:
    def test_iso_utc_milliseconds(self):
        """Timestamps are ISO-8601 UTC with exactly three fractional digits and a Z."""
        text = protocol.format_timestamp(1_700_000_000.1234)
        assert text == "2023-11-14T22:13:20.123Z"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", protocol.now_timestamp())

    def test_round_trip(self):
        """parse_timestamp inverts format_timestamp to the millisecond."""
        t = 1_765_432_100.987
        assert protocol.parse_timestamp(protocol.format_timestamp(t)) == pytest.approx(t, abs=1e-3)

    def test_cache_crosses_seconds(self):
        """The per-second cache does not leak a stale prefix into the next second."""
        assert protocol.format_timestamp(10.999).endswith("00:00:10.999Z")
        assert protocol.format_timestamp(11.0).endswith("00:00:11.000Z")


class TestNonFinite:
    def test_strings_on_disk_floats_on_load(self):
        """NaN and infinities are written as strings and come back as floats."""
        record = protocol.make_finite({"type": "metrics", "a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5})
        line = protocol.encode(record)
        assert b'"a":"NaN"' in line and b'"b":"Infinity"' in line and b'"c":"-Infinity"' in line
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
        back = protocol.decode(line)
        assert math.isnan(back["a"]) and back["b"] == math.inf and back["c"] == -math.inf and back["d"] == 1.5

    @pytest.mark.skipif(not have_jq(), reason="jq is not installed (scripts/system-deps installs it)")
    def test_jq_reads_every_line(self, tmp_path):
        """jq parses a stream containing non-finite values."""
        path = tmp_path / "s.jsonl"
        path.write_bytes(b"".join(protocol.encode(protocol.make_finite({"type": "metrics", "loss": v})) for v in (1.0, math.nan, math.inf)))
        out = subprocess.run(["jq", "-r", ".loss"], input=path.read_bytes(), capture_output=True, check=True)
        assert out.stdout.decode().split() == ["1", "NaN", "Infinity"]

    def test_decode_rejects_non_objects(self):
        """A line that is valid JSON but not an object is an error naming what it was."""
        with pytest.raises(ValueError, match="must be a JSON object, got list"):
            protocol.decode(b"[1, 2]")


class TestSupersession:
    def test_resume_hides_later_steps_of_earlier_segments(self):
        """Segment 1 resumed from 400: segment 0's records after step 400 are superseded."""
        limits = protocol.superseded_after([{"segment": 0}, {"segment": 1, "resumed_from_step": 400}])
        assert limits == {0: 400.0, 1: math.inf}

    def test_earliest_resume_wins_for_old_segments(self):
        """Two resumes: the oldest segment is cut at the smaller resume point."""
        limits = protocol.superseded_after(
            [{"segment": 0}, {"segment": 1, "resumed_from_step": 400}, {"segment": 2, "resumed_from_step": 300}]
        )
        assert limits == {0: 300.0, 1: 300.0, 2: math.inf}

    def test_segment_without_resume_only_appends(self):
        """A later segment that names no resume step supersedes nothing."""
        assert protocol.superseded_after([{"segment": 0}, {"segment": 1}]) == {0: math.inf, 1: math.inf}


def test_timestamps_match_strftime_everywhere():
    """The per-minute and per-millisecond caches give what strftime gives, for any time."""
    import random
    from datetime import datetime, timezone

    rng = random.Random(11)
    times = [rng.uniform(0, 4e9) for _ in range(20_000)] + [59.9995, 60.0, 3599.999, 86_400.0]
    walk = [1_764_486_059.5]  # then times a training run logs: ms apart, across seconds and minutes
    for _ in range(20_000):
        walk.append(walk[-1] + rng.choice([0.0, 0.0004, 0.003, 0.2, 1.7]))
    times += walk
    for t in times:
        ms = int(t * 1000)
        expected = datetime.fromtimestamp(ms // 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"
        assert protocol.format_timestamp(t) == expected, t


def test_make_finite_writes_what_the_encoder_refuses():
    """Integers beyond 64 bits become floats (beyond the float range: the protocol's
    infinities); keys the encoder cannot write become their str()."""
    out = protocol.make_finite({"a": 2**70, "b": -(10**400), (1, 2): [10**400, math.nan], 3: True})
    assert out == {"a": float(2**70), "b": "-Infinity", "(1, 2)": ["Infinity", "NaN"], 3: True}
    assert json.loads(protocol.dumps(out)) == {"a": float(2**70), "b": "-Infinity", "(1, 2)": ["Infinity", "NaN"], "3": True}
