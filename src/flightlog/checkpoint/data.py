"""Data position: which epoch, how many batches of it were consumed, and an order that
depends only on (seed, epoch) so that a resumed process sees the same batches.

A ``RandomSampler`` without its own generator draws its permutation from the global
torch RNG when an epoch starts; restoring the RNG saved mid-epoch would then give a
different permutation. :class:`EpochSampler` (like ``DistributedSampler``) derives the
order from ``seed + epoch`` instead. Skipping consumed batches happens at the index
level (no sample is loaded twice) when the loader has a batch sampler.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sized
from typing import Any


class EpochSampler:
    """A shuffling sampler whose order is a function of ``seed`` and ``set_epoch(epoch)``."""

    def __init__(self, data_source: Sized | int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.n = data_source if isinstance(data_source, int) else len(data_source)
        if self.n < 0:
            raise ValueError("flightlog: EpochSampler needs a non-negative length")
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.n))
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())


class _SkipBatches:
    """A batch sampler that leaves out the first ``skip`` batches of another."""

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


def set_epoch(loader: Any, epoch: int) -> None:
    """Tell the loader's sampler (or batch sampler) which epoch starts."""
    for holder in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if holder is not None and hasattr(holder, "set_epoch"):
            holder.set_epoch(epoch)
            return


def skip_batches(loader: Any, skip: int) -> Any:
    """An iterable over ``loader`` without its first ``skip`` batches.

    For a torch ``DataLoader`` with a batch sampler the indices are skipped, so no
    sample is loaded for nothing; anything else is iterated and the batches dropped.
    """
    if skip <= 0:
        return loader
    try:
        from torch.utils.data import DataLoader
    except ImportError:  # pragma: no cover - torch is there whenever a loader is
        DataLoader = None  # type: ignore[assignment,misc]
    if DataLoader is not None and isinstance(loader, DataLoader) and loader.batch_sampler is not None and not _iterable_dataset(loader):
        return DataLoader(
            loader.dataset,
            batch_sampler=_SkipBatches(loader.batch_sampler, skip),
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator,
            persistent_workers=loader.persistent_workers,
        )
    return itertools.islice(loader, skip, None)


def _iterable_dataset(loader: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(loader.dataset, IterableDataset)
