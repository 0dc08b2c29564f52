"""torch.utils.data.DistributedSampler: each rank's share of the dataset indices.

Same arithmetic as torch: each epoch one permutation of 0..n-1 (from `seed + epoch`,
identical on every rank), then either padded by repeating its head until it divides
evenly into `num_replicas` (drop_last=False; so at most num_replicas - 1 samples are
seen twice per epoch), or cut to a multiple of num_replicas (drop_last=True); rank r
takes positions r, r + num_replicas, r + 2·num_replicas, ... Within an epoch the
shards are disjoint apart from that padding. Only the permutation itself differs from
torch: numpy's `default_rng(seed + epoch).permutation(n)` instead of torch.randperm.
Without `set_epoch` every epoch repeats the same order, as in torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.arrays import Array


class DistributedSampler:
    """Indices of rank `rank`'s shard, one epoch per iteration."""

    def __init__(
        self,
        dataset_len: int,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if dataset_len < 0:
            raise InvalidRequest(f"dataset_len must be >= 0, got {dataset_len}")
        if num_replicas < 1:
            raise InvalidRequest(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise InvalidRequest(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset_len = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        if drop_last and dataset_len % num_replicas:
            # torch: drop the tail so that every rank gets the same number of samples.
            self.num_samples = math.ceil((dataset_len - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(dataset_len / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's permutation; call it before each epoch's iteration."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    @property
    def padding(self) -> int:
        """Indices repeated per epoch to even out the shards (0 with drop_last)."""
        return max(0, self.total_size - self.dataset_len)

    def indices(self) -> Array:
        """This rank's indices for the current epoch, as an int64 array."""
        n = self.dataset_len
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        if not self.drop_last:
            pad = self.total_size - n
            if pad and n:
                # torch: repeat the list as often as needed, take the first `pad` of it.
                order = np.concatenate([order, np.tile(order, math.ceil(pad / n))[:pad]])
        else:
            order = order[: self.total_size]
        shard = order[self.rank : self.total_size : self.num_replicas]
        assert len(shard) == self.num_samples
        return shard.astype(np.int64)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())
