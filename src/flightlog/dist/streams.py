"""Per-rank streams (``rank-N.jsonl``): each rank's own, unreduced records.

The main stream says what the job did; a rank stream says what one rank did, so a
straggler or a rank that diverged can be examined afterwards. Every record carries
``rank``; the stream's ``run_start`` also carries the host name and node address.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from flightlog.pipeline.queue import RecordQueue
from flightlog.pipeline.writer import Writer
from flightlog.protocol import RUN_END, RUN_START, SCHEMA_VERSION
from flightlog.sinks.jsonl import JsonlSink


def stream_name(rank: int) -> str:
    return f"rank-{rank}.jsonl"


def node_address() -> str:
    """The local address this node uses to reach the rendezvous host (no packet is sent)."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
                return str(s.getsockname()[0])
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "unknown"


def rank_info(rank: int) -> dict[str, Any]:
    """Who this rank is: rank, local rank, node rank, host name, node address, pid."""
    env = os.environ
    info: dict[str, Any] = {"rank": rank}
    for key, name in (("local_rank", "LOCAL_RANK"), ("node_rank", "GROUP_RANK")):
        if env.get(name, "").isdigit():
            info[key] = int(env[name])
    info.update(host=socket.gethostname(), node_address=node_address(), pid=os.getpid())
    return info


class RankTagger:
    """Processor: ``rank`` on every record, the rank's identity on ``run_start``."""

    skip_emitted = False

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.rank = info["rank"]

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        record["rank"] = self.rank
        if record.get("type") == RUN_START:
            record.update(self.info)
        return record


class TopologyTagger:
    """Processor for rank 0's main stream: ``run_start`` lists every rank's host and address."""

    def __init__(self, ranks: list[dict[str, Any]]) -> None:
        self.ranks = ranks

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if record.get("type") == RUN_START:
            record["world_size"] = len(self.ranks)
            record["ranks"] = self.ranks
        return record


class RankStream:
    """Rank 0's own ``rank-0.jsonl``: a second, small pipeline next to the main one."""

    def __init__(self, config: Any, log_dir: Any, run_id: str, info: dict[str, Any], segment: int, redactor: Any = None) -> None:
        self.queue = RecordQueue(config.queue_size, config.on_full)
        sink = JsonlSink(log_dir, fsync=config.fsync, filename=stream_name(info["rank"]))
        processors: list[Any] = [RankTagger(info)] + ([redactor] if redactor is not None else [])
        self.writer = Writer(
            self.queue, [sink], run_id=run_id, processors=processors,
            flush_interval=config.flush_interval, name=f"flightlog-rank-{info['rank']}",
        )
        self.put = self.queue.put
        self.writer.start()
        self.put((RUN_START, time.time(), None, None, {"schema_version": SCHEMA_VERSION, "segment": segment}))

    def flush(self, timeout: float | None = 10.0) -> bool:
        return self.writer.flush(timeout)

    def close(self, status: str, timeout: float = 10.0) -> None:
        self.queue.put_urgent((RUN_END, time.time(), None, None, {"status": status}))
        self.writer.close(timeout)
