"""Import speed: ms-swift logging.jsonl and seeds-format text logs into protocol records,
flightlog's importers against what users reach for instead.

    .venv/bin/python bench/importers.py [--lines 200000]

Writes the files to a temporary folder once, then times each reader over them (best of
3). flightlog's numbers include everything the importers do: unit conversions, step
parsing, duplicate/restart checks and counting bad input. Prints a table; see
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Callable


def swift_line(step: int, total: int) -> str:
    return json.dumps({
        "loss": 2.0 - step * 1e-6, "grad_norm": 1.1, "learning_rate": 9.9e-05, "memory(GiB)": 14.3,
        "train_speed(s/it)": 1.8, "epoch": step / total, "global_step/max_steps": f"{step}/{total}",
        "percentage": f"{100 * step / total:.2f}%", "elapsed_time": "1m 31s", "remaining_time": "13m 40s",
    })


def text_line(step: int, total: int) -> str:
    return f"Step {step}/{total} | epoch {step / total:.2f} | loss {2.0 - step * 1e-6:.4f} | lr 9.98e-05 | grad_norm 1.234 | gpu_mem 14.2GB/24.0GB | time 1.82s/step"


def best(fn: Callable[[], int], repeat: int = 3) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        count = fn()
        times.append(time.perf_counter() - t)
    return min(times), count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    n = parser.parse_args().lines
    from flightlog.store.importers.swift import SwiftImporter
    from flightlog.store.importers.text import TextImporter

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        swift = Path(tmp) / "logging.jsonl"
        swift.write_text("".join(swift_line(s, n) + "\n" for s in range(1, n + 1)))
        text = Path(tmp) / "train.log"
        text.write_text("".join(text_line(s, n) + "\n" for s in range(1, n + 1)))

        def flightlog_swift() -> int:
            return sum(1 for r in SwiftImporter(swift).records() if r["type"] == "metrics")

        def pandas_read_json() -> int:
            import pandas

            return len(pandas.read_json(swift, lines=True))

        def polars_read_ndjson() -> int:
            import polars

            return polars.read_ndjson(swift).height

        def json_loop() -> int:
            with open(swift) as fh:
                return sum(1 for line in fh if json.loads(line))

        def flightlog_text() -> int:
            return sum(1 for r in TextImporter(text).records() if r["type"] == "metrics")

        pattern = re.compile(r"Step (\d+)/(\d+) \| epoch (\S+) \| loss (\S+) \| lr (\S+) \| grad_norm (\S+)")

        def regex_loop() -> int:
            out = []
            with open(text) as fh:
                for line in fh:
                    m = pattern.match(line)
                    if m:
                        out.append({"step": int(m.group(1)), "epoch": float(m.group(3)), "loss": float(m.group(4)), "lr": float(m.group(5))})
            return len(out)

        for name, what, fn in (
            ("flightlog SwiftImporter (mapped records)", "logging.jsonl", flightlog_swift),
            ("pandas.read_json(lines=True) (raw columns)", "logging.jsonl", pandas_read_json),
            ("polars.read_ndjson (raw columns)", "logging.jsonl", polars_read_ndjson),
            ("json.loads per line (raw dicts)", "logging.jsonl", json_loop),
            ("flightlog TextImporter (seeds template)", "train.log", flightlog_text),
            ("hand-written regex loop (4 fields)", "train.log", regex_loop),
        ):
            seconds, count = best(fn)
            rows.append((name, what, count, seconds))
    print(f"{'reader':<46} {'file':<14} {'records':>9} {'seconds':>8} {'lines/s':>10}")
    for name, what, count, seconds in rows:
        print(f"{name:<46} {what:<14} {count:>9} {seconds:>8.3f} {n / seconds:>10,.0f}")


if __name__ == "__main__":
    main()
