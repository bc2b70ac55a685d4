"""flightlog's own collectives: a private gloo group with timeouts, and naming the rank
that stopped answering.

flightlog never waits on a peer forever: its collectives run on a gloo group of its own
(created once at ``init`` with ``timeout=dist_timeout``) and are waited on with that
timeout, so a dead or hung rank turns into :class:`CollectiveFailure` instead of a hang,
and the user's own process group is never left poisoned by one of our timeouts.
Neither gloo nor NCCL says *which* rank is missing, so after a failure every survivor
checks in under a key in the job's rendezvous store and waits until the deadline for
the others: the ranks that never check in are the ones that stopped answering.

With NCCL as the default backend, CUDA metric tensors are all-reduced on the default
group (no host-device sync on the training thread; the NCCL watchdog enforces the group's
timeout there); everything else goes through the gloo group on the CPU.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable

POLL_S = 0.05


class CollectiveFailure(RuntimeError):
    """A flightlog collective failed or timed out; ``missing`` are the ranks that did not answer."""

    def __init__(self, op: str, seconds: float, cause: BaseException, missing: list[int] | None) -> None:
        self.op, self.seconds, self.cause, self.missing = op, seconds, cause, missing
        super().__init__(f"{op} failed after {seconds:.1f}s: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")


class DistributedTimeout(RuntimeError):
    """Raised from ``Run.log`` when a rank stopped answering (``dist_on_failure="raise"``)."""

    def __init__(self, message: str, ranks: list[int] | None) -> None:
        super().__init__(message)
        self.ranks = ranks


def default_store() -> Any:
    """The rendezvous store of the default group (torchrun's agent store, or rank 0's TCPStore)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def missing_ranks(store: Any, prefix: str, world: int, deadline: float, skip: int | None = None) -> list[int] | None:
    """Ranks whose key ``prefix/r`` does not appear before ``deadline`` (None: the store is unreachable)."""
    waiting = [r for r in range(world) if r != skip]
    try:
        while True:
            waiting = [r for r in waiting if not store.check([f"{prefix}/{r}"])]
            if not waiting or time.monotonic() >= deadline:
                return waiting
            time.sleep(POLL_S)
    except Exception:
        return None


def wait_key(store: Any, key: str, deadline: float) -> bool:
    """Whether ``key`` appears in the store before ``deadline``."""
    while not store.check([key]):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


class Comm:
    """The collectives of one distributed run (all ranks construct it at the same point)."""

    def __init__(self, timeout: float, namespace: str, store: Any) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.timeout = timeout
        self.namespace = namespace
        self.store = store
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        backend = str(dist.get_backend())
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if "nccl" in backend and torch.cuda.is_available()
            else None
        )
        self.seq = 0

    # ------------------------------------------------------------------ collectives
    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's ``values`` (same length on every rank), on the gloo group."""
        torch = self._torch
        mine = torch.tensor(values, dtype=torch.float64)
        out = torch.empty(self.world * len(values), dtype=torch.float64)
        gather = getattr(self._dist, "all_gather_single", None) or self._dist.all_gather_into_tensor  # renamed in 2.1x
        self._timed("all_gather", lambda: gather(out, mine, group=self.group, async_op=True))
        return out.view(self.world, len(values)).tolist()

    def all_reduce_sum(self, tensor: Any) -> Any:
        """Sum ``tensor`` over ranks in place: CUDA tensors on the default (NCCL) group without a host
        wait, CPU tensors on the gloo group with the timeout."""
        dist = self._dist
        if tensor.is_cuda:
            self.seq += 1
            dist.all_reduce(tensor, group=None, async_op=True).wait()  # stream wait, no host sync
            return tensor
        self._timed("all_reduce", lambda: dist.all_reduce(tensor, group=self.group, async_op=True))
        return tensor

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj`` (rare path: ranks log different keys)."""
        out: list[Any] = [None] * self.world

        def start() -> Any:
            self._dist.all_gather_object(out, obj, group=self.group)  # bounded by the group's timeout
            return None

        self._timed("all_gather_object", start)
        return out

    def _timed(self, op: str, start: Callable[[], Any]) -> None:
        self.seq += 1
        t0 = time.monotonic()
        try:
            work = start()
            if work is not None and not work.wait(timeout=timedelta(seconds=self.timeout)):
                raise TimeoutError(f"no answer within {self.timeout}s")
        except Exception as exc:
            raise CollectiveFailure(op, time.monotonic() - t0, exc, self.diagnose(t0)) from exc

    def diagnose(self, started: float) -> list[int] | None:
        """Check in as alive after a failed collective; the ranks that do not check in by the deadline."""
        prefix = f"{self.namespace}/alive/{self.seq}"
        try:
            self.store.set(f"{prefix}/{self.rank}", "1")
        except Exception:
            return None
        deadline = max(started + self.timeout, time.monotonic() + 1.0)
        return missing_ranks(self.store, prefix, self.world, deadline, skip=self.rank)
