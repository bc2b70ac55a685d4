"""The Run of each rank under torch.distributed.

Rank 0 gets a :class:`DistributedRun`: the ordinary Run (main stream, console,
run.json) whose ``log`` reduces each kept step across ranks before enqueuing it. Every
other rank gets a :class:`FollowerRun`: the same API, so the training loop never
branches on rank, but nothing reaches the main stream; with ``rank_streams`` its own
records go to ``rank-N.jsonl``. Every rank's ``log`` takes part in the collectives, so
every rank must call ``flightlog.init`` (``dist_mode="off"`` if only rank 0 does).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, Iterable

from flightlog.config import Config
from flightlog.dist.comm import CollectiveFailure, Comm, DistributedTimeout, default_store, missing_ranks, wait_key
from flightlog.dist.policy import Policy
from flightlog.dist.reduce import Reducer
from flightlog.dist.straggler import StragglerDetector
from flightlog.dist.streams import RankStream, RankTagger, TopologyTagger, rank_info, stream_name
from flightlog.protocol import METRICS
from flightlog.run import OnLogHook, Run, new_run_id
from flightlog.sinks.jsonl import JsonlSink
from flightlog.values import PLAIN_TYPES, snapshot

_inits = 0  # flightlog.init calls with a process group in this process: namespaces store keys


def _snap(data: dict[str, Any]) -> dict[str, Any]:
    for value in data.values():
        if type(value) not in PLAIN_TYPES:
            return snapshot(data)
    return dict(data)


class DistributedRun(Run):
    """Rank 0 of a distributed job (or a rank whose group is not initialised)."""

    def __init__(
        self,
        config: Config,
        *,
        info: dict[str, Any],
        ranks: list[dict[str, Any]] | None = None,
        processors: Iterable[Any] = (),
        on_log: Iterable[OnLogHook] = (),
    ) -> None:
        self.rank: int = info["rank"]
        self.rank_info = info
        self._reducer: Reducer | None = None
        self._broken = False
        self._mismatches: set[tuple[int, ...]] = set()
        self._detector = StragglerDetector(config.straggler_margin, config.straggler_patience)
        self._rank_stream: RankStream | None = None
        chain = ([TopologyTagger(ranks)] if ranks else []) + list(processors)
        super().__init__(config, processors=chain, on_log=on_log)
        self._writes_main = self.rank == 0
        self._local: Any = None
        if config.rank_streams and self._writes_main:
            self._rank_stream = RankStream(config, self.log_dir, self.run_id, info, self.segment, self._redactor)
            self._local = self._rank_stream.put

    def attach(self, comm: Comm) -> None:
        """Start reducing through ``comm`` (every rank attaches at the same point of init)."""
        policy = Policy(self.config.dist_policy, self.config.dist_weight)
        self._reducer = Reducer(comm, policy, reduce_values=self.config.dist_mode == "reduce")

    # ------------------------------------------------------------------ hot path
    def log(self, metrics: Mapping[str, Any], step: int | None = None, epoch: float | None = None) -> None:
        """As :meth:`Run.log`; at a kept step every rank joins one gather and one all-reduce."""
        if step is None:
            step = self._next_step
        elif type(step) is not int:
            step = self._coerce_step(step)
        self._next_step = step + 1
        if self._thinning and not self._keep(step, epoch, metrics):
            return
        if not isinstance(metrics, Mapping):
            raise TypeError(f"flightlog: log() takes a dict of metrics, got {type(metrics).__name__}")
        if self._finished:
            self._put(None)  # warns once, no collective: the other ranks will see this rank as gone
            return
        data = dict(metrics)
        if self._hooks:
            self._call_hooks(data, step)
        now = time.time()
        if self._local is not None:
            self._local((METRICS, now, step, epoch, _snap(data)))
        out = self._reduce(data, step)
        if self._writes_main:
            self._put((METRICS, now, step, epoch, _snap(out)))

    def _call_hooks(self, data: dict[str, Any], step: int) -> None:
        # As Run._run_hooks, but extras stay raw: a CUDA tensor must reach the reducer un-copied.
        for hook in self._hooks:
            try:
                extra = hook(data, step)
                if isinstance(extra, Mapping):
                    data.update(extra)
            except Exception as exc:
                name = getattr(hook, "__name__", repr(hook))
                self.event(f"on_log hook {name} failed: {type(exc).__name__}: {exc}", level="ERROR", source="flightlog/hooks")

    def _reduce(self, data: dict[str, Any], step: int) -> dict[str, Any]:
        reducer = self._reducer
        if reducer is None or self._broken:
            return data
        try:
            result = reducer(data, step)
        except CollectiveFailure as exc:
            self._failed(exc, step)
            return data
        if not self._writes_main:
            return data
        out = dict(data)
        out.update(result.values)
        if result.key_mismatch:
            self._report_mismatch(result.key_mismatch, step)
        found = self._detector.update(result.steps, result.step_times, result.memory_mb)
        out.update(found.fields)
        for rule, message, fields in found.alerts:
            self.alert(rule, message, step=step, **fields)
        return out

    def _report_mismatch(self, lacking: dict[int, list[str]], step: int) -> None:
        key = tuple(sorted((r, tuple(k)) for r, k in lacking.items()))
        if key in self._mismatches:
            return
        self._mismatches.add(key)
        parts = "; ".join(f"rank {r} does not log {', '.join(keys)}" for r, keys in sorted(lacking.items()))
        self.event(
            f"ranks log different metrics at step {step}: {parts}; each is reduced over the ranks that log it",
            level="WARNING", source="flightlog/dist", step=step,
        )

    def _failed(self, exc: CollectiveFailure, step: int) -> None:
        self._broken = True
        missing = exc.missing
        if missing is None:
            who = "a rank (which one is unknown: the rendezvous store is unreachable, so rank 0 or the launcher is gone)"
        elif not missing:
            who = "no rank (all checked in)"
        else:
            who = ("rank " if len(missing) == 1 else "ranks ") + ", ".join(map(str, missing))
        cause = str(exc.cause).splitlines()[0] if str(exc.cause) else type(exc.cause).__name__
        message = (
            f"{who} stopped answering: flightlog's {exc.op} at step {step} failed on rank {self.rank} "
            f"after {exc.seconds:.1f}s ({cause}); metrics are no longer reduced across ranks"
        )
        print(f"flightlog: {message}", file=sys.stderr, flush=True)
        self.event(message, level="CRITICAL", source="flightlog/dist", step=step, ranks=missing, reporting_rank=self.rank)
        self.flush(5.0)
        if self.config.dist_on_failure == "raise":
            raise DistributedTimeout(message, missing) from exc

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = 10.0) -> bool:
        done = super().flush(timeout)
        if self._rank_stream is not None:
            done = self._rank_stream.flush(timeout) and done
        return done

    def finish(self, status: str = "finished", summary: Mapping[str, Any] | None = None, timeout: float = 30.0) -> None:
        super().finish(status, summary, timeout)
        stream, self._rank_stream = self._rank_stream, None
        if stream is not None:
            stream.close(status, timeout)


class _NoRunFile:
    """A follower never writes run.json: rank 0 owns it."""

    def update(self, fsync: bool = False, **fields: Any) -> None:
        pass


class FollowerRun(DistributedRun):
    """Rank != 0: same API, nothing in the main stream; its own records in ``rank-N.jsonl`` if enabled."""

    def __init__(
        self,
        config: Config,
        *,
        info: dict[str, Any],
        shared: dict[str, Any],
        processors: Iterable[Any] = (),
        on_log: Iterable[OnLogHook] = (),
    ) -> None:
        self._shared = shared
        sinks: list[Any] = []
        if config.rank_streams:
            sinks = [JsonlSink(config.resolved_log_dir, fsync=config.fsync, filename=stream_name(info["rank"]))]
        config = dataclasses.replace(config, run_id=shared["run_id"], sinks=sinks)
        super().__init__(config, info=info, processors=[RankTagger(info), *processors], on_log=on_log)
        self._local = self._put if config.rank_streams else None

    def _read_previous(self) -> dict[str, Any] | None:
        s = self._shared
        return {"run_id": s["run_id"], "segment": s.get("segment", 0) - 1, "run_name": s.get("run_name"), "start_time": s.get("start_time")}

    def _open_run_file(self, meta: dict[str, Any]) -> Any:
        return _NoRunFile()


# ---------------------------------------------------------------------- init
def start_run(config: Config, *, processors: Iterable[Any] = (), on_log: Iterable[OnLogHook] = ()) -> Run | None:
    """This rank's Run, or None when the process is not part of a distributed job."""
    import os

    import torch.distributed as dist

    processors, on_log = list(processors), list(on_log)
    if not (dist.is_available() and dist.is_initialized()):
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        if world <= 1:
            return None
        info = rank_info(rank)
        if rank != 0:
            shared = {"run_id": config.run_id or new_run_id(), "segment": 0}
            return FollowerRun(config, info=info, shared=shared, processors=processors, on_log=on_log)
        run = DistributedRun(config, info=info, processors=processors, on_log=on_log)
        run.event(
            f"WORLD_SIZE={world} but torch.distributed was not initialised when flightlog.init ran: "
            "only rank 0 writes, and its metrics are its own (call flightlog.init after init_process_group)",
            level="WARNING", source="flightlog/dist",
        )
        return run

    global _inits
    _inits += 1
    ns = f"flightlog/{_inits}"
    rank, world = dist.get_rank(), dist.get_world_size()
    timeout = config.dist_timeout
    collectives = config.dist_mode != "off"
    store = default_store()
    info = rank_info(rank)
    store.set(f"{ns}/rank/{rank}", json.dumps(info))
    run: DistributedRun
    if rank == 0:
        deadline = time.monotonic() + (timeout if collectives else 0.0)
        missing = missing_ranks(store, f"{ns}/rank", world, deadline) or []
        if collectives and missing:
            raise RuntimeError(
                f"flightlog: rank(s) {', '.join(map(str, missing))} did not call flightlog.init within "
                f"dist_timeout={timeout}s; every rank must call it (the others get a run that writes nothing), "
                "or pass dist_mode='off' when only rank 0 does"
            )
        ranks = [info] + [json.loads(store.get(f"{ns}/rank/{r}")) for r in range(1, world) if r not in missing]
        run = DistributedRun(config, info=info, ranks=ranks, processors=processors, on_log=on_log)
        shared = {"run_id": run.run_id, "segment": run.segment, "run_name": run.run_name, "start_time": run.start_time}
        store.set(f"{ns}/run", json.dumps(shared))
    else:
        shared = {"run_id": config.run_id or new_run_id(), "segment": 0}
        if collectives or config.rank_streams:
            if not wait_key(store, f"{ns}/run", time.monotonic() + timeout):
                raise RuntimeError(f"flightlog: rank 0 did not finish flightlog.init within dist_timeout={timeout}s")
            shared = json.loads(store.get(f"{ns}/run"))
        run = FollowerRun(config, info=info, shared=shared, processors=processors, on_log=on_log)
    if collectives:
        try:
            run.attach(Comm(timeout, ns, store))
        except BaseException:
            run.finish("failed")
            raise
    return run
