"""DistributedSampler: torch's sharding and padding arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.sampler import DistributedSampler


def _shards(n: int, world: int, **kw: object) -> list[list[int]]:
    return [list(DistributedSampler(n, world, r, **kw)) for r in range(world)]  # type: ignore[arg-type]


def test_padding_repeats_the_head_as_torch_does() -> None:
    # torch: 10 samples on 3 ranks -> 4 each; the list is padded with its first 2.
    assert _shards(10, 3, shuffle=False) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert DistributedSampler(10, 3, 0).padding == 2
    # Padding longer than the dataset: the list repeats as often as needed.
    assert _shards(2, 5, shuffle=False) == [[0], [1], [0], [1], [0]]


def test_drop_last_cuts_the_tail() -> None:
    assert _shards(10, 3, shuffle=False, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert len(DistributedSampler(10, 3, 0, drop_last=True)) == 3
    assert DistributedSampler(10, 3, 0, drop_last=True).padding == 0


@pytest.mark.parametrize(("n", "world"), [(100, 4), (97, 4), (1347, 16), (5, 1)])
def test_shards_are_disjoint_and_cover_the_dataset(n: int, world: int) -> None:
    shards = _shards(n, world, seed=3)
    assert {len(s) for s in shards} == {-(-n // world)}  # equal sizes: ceil(n / world)
    everything = [i for s in shards for i in s]
    assert set(everything) == set(range(n))
    assert len(everything) - n == (-n) % world  # repeats: exactly torch's padding


def test_epochs_reshuffle_from_seed_plus_epoch() -> None:
    s = DistributedSampler(50, 2, 1, seed=7)
    first = list(s)
    assert list(s) == first  # no set_epoch: the same order again, as in torch
    s.set_epoch(1)
    second = list(s)
    assert second != first
    expected = np.random.default_rng(7 + 1).permutation(50)[1::2]
    assert second == expected.tolist()
    # Every rank uses the same permutation, so the epoch's shards stay disjoint.
    other = DistributedSampler(50, 2, 0, seed=7)
    other.set_epoch(1)
    assert not set(other) & set(second)


def test_bad_rank_is_refused() -> None:
    with pytest.raises(InvalidRequest, match=r"rank 4.*\[0, 3\]"):
        DistributedSampler(10, 4, 4)
    with pytest.raises(InvalidRequest):
        DistributedSampler(10, 0, 0)
