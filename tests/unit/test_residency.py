"""ResidencyManager: LRU-by-bytes eviction, pinning, counters and errors."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.residency import LoadResult, ResidencyManager

BW = 10.0  # bytes/s: small numbers keep the expected load times readable


def manager(capacity: int = 100, **weights: int) -> ResidencyManager:
    r = ResidencyManager(capacity, BW)
    for name, nbytes in weights.items():
        r.register(name, nbytes)
    return r


def test_miss_loads_and_hit_costs_nothing() -> None:
    r = manager(A=40)

    first = r.ensure("A")
    assert first == LoadResult(hit=False, loaded_bytes=40, evicted=(), load_s=4.0)
    assert r.is_resident("A")
    assert r.used_bytes == 40
    assert r.free_bytes == 60

    second = r.ensure("A")
    assert second == LoadResult(hit=True, loaded_bytes=0, evicted=(), load_s=0.0)
    assert (r.hits, r.misses, r.bytes_loaded, r.loads("A")) == (1, 1, 40, 1)


def test_touching_an_entry_protects_it_and_eviction_goes_by_bytes() -> None:
    r = manager(A=40, B=30, C=30, D=50)
    for name in ("A", "B", "C"):
        r.ensure(name)
    assert r.free_bytes == 0
    r.ensure("A")  # A becomes most recently used
    assert r.resident() == ["B", "C", "A"]

    result = r.ensure("D")

    # D needs 50 bytes: evicting B frees only 30, so C goes too; A was used last and stays.
    assert result.evicted == ("B", "C")
    assert result.loaded_bytes == 50
    assert result.load_s == pytest.approx(5.0)
    assert r.resident() == ["A", "D"]
    assert r.used_bytes == 90
    assert not r.is_resident("B")
    assert not r.is_resident("C")


def test_a_small_load_evicts_only_as_many_bytes_as_it_needs() -> None:
    # Big B is the oldest; A and C are small. D (15 bytes) needs 5 more than the 10 free.
    r = manager(B=60, A=10, C=20, D=15)
    for name in ("B", "A", "C"):
        r.ensure(name)
    assert r.free_bytes == 10

    result = r.ensure("D")

    # One eviction: the oldest, B, even though it frees far more than needed. A policy
    # that evicts a fixed number of slots (e.g. two) would also have thrown out A.
    assert result.evicted == ("B",)
    assert r.resident() == ["A", "C", "D"]
    assert r.free_bytes == 100 - 10 - 20 - 15


def test_eviction_is_strictly_oldest_first_not_best_fit() -> None:
    r = manager(A=10, B=60, C=20, D=25)
    for name in ("A", "B", "C"):
        r.ensure(name)

    # D needs 15 more bytes than the 10 free. B alone would do, but A is older: A goes
    # first, is not enough, then B goes.
    assert r.ensure("D").evicted == ("A", "B")
    assert r.resident() == ["C", "D"]


def test_pinned_entries_are_never_evicted() -> None:
    r = manager(A=40, B=30, C=30, D=30)
    pin_result = r.pin("A")  # not resident yet: pinning loads it
    assert pin_result == LoadResult(hit=False, loaded_bytes=40, evicted=(), load_s=4.0)
    r.ensure("B")
    r.ensure("C")
    assert r.resident() == ["A", "B", "C"]
    assert r.is_pinned("A")

    # A is the least recently used, but pinned: B is evicted instead.
    assert r.ensure("D").evicted == ("B",)
    assert r.is_resident("A")

    r.unpin("A")
    assert not r.is_pinned("A")
    r.ensure("B")  # now A, the oldest, may go
    assert not r.is_resident("A")
    assert r.resident() == ["C", "D", "B"]


def test_pinning_a_resident_entry_is_a_hit() -> None:
    r = manager(A=10, B=10)
    r.ensure("A")
    r.ensure("B")
    assert r.pin("A").hit
    assert r.resident() == ["B", "A"]  # pinning is a use
    assert r.pin("A").hit  # twice is the same as once
    r.unpin("A")
    r.unpin("A")  # unpinning an unpinned entry is harmless
    assert not r.is_pinned("A")


def test_out_of_memory_when_pinned_entries_block() -> None:
    r = manager(A=60, B=30, C=20)
    r.pin("A")
    r.pin("B")

    # 10 bytes free and nothing evictable: C (20 bytes) cannot be loaded.
    with pytest.raises(OutOfMemory) as info:
        r.ensure("C")
    assert info.value.free_bytes == 10
    assert r.resident() == ["A", "B"]

    r.unpin("B")
    assert r.ensure("C").evicted == ("B",)


def test_out_of_memory_reports_the_bytes_eviction_could_reach() -> None:
    r = manager(A=60, B=20, C=10, D=45)
    r.pin("A")
    r.ensure("B")
    r.ensure("C")
    before = (r.resident(), r.used_bytes, r.hits, r.misses, r.bytes_loaded, r.loads("D"))

    with pytest.raises(OutOfMemory) as info:
        r.ensure("D")

    # 10 bytes free plus the unpinned B (20) and C (10): 40 reachable, 45 asked.
    err = info.value
    assert (err.socket, err.tier, err.asked_bytes, err.free_bytes) == (
        "reserved-region",
        "hbm",
        45,
        40,
    )
    assert "for D" in str(err)
    # Nothing was evicted on the way to finding out.
    assert (r.resident(), r.used_bytes, r.hits, r.misses, r.bytes_loaded, r.loads("D")) == before


def test_weights_larger_than_the_region_register_but_cannot_load() -> None:
    r = manager(capacity=100, huge=101)
    with pytest.raises(OutOfMemory) as info:
        r.ensure("huge")
    assert info.value.socket == "reserved-region"
    assert info.value.tier == "hbm"
    assert info.value.asked_bytes == 101
    assert info.value.free_bytes == 100
    assert r.resident() == []


def test_counters_track_hits_misses_bytes_and_loads_per_name() -> None:
    r = manager(A=60, B=60)
    r.ensure("A")  # miss
    r.ensure("A")  # hit
    r.ensure("B")  # miss, evicts A
    r.ensure("A")  # miss, evicts B
    r.ensure("A")  # hit

    assert r.hits == 2
    assert r.misses == 3
    assert r.bytes_loaded == 180
    assert r.loads("A") == 2
    assert r.loads("B") == 1
    assert r.capacity_bytes == 100


def test_duplicate_and_negative_registrations_are_refused() -> None:
    r = manager(A=10)
    with pytest.raises(InvalidRequest, match="already registered"):
        r.register("A", 20)
    with pytest.raises(InvalidRequest, match="negative"):
        r.register("B", -1)
    r.ensure("A")
    assert r.used_bytes == 10  # the refused re-registration did not change A's size


def test_invalid_region_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        ResidencyManager(-1, BW)
    with pytest.raises(InvalidRequest):
        ResidencyManager(100, 0.0)


def test_unknown_names_list_the_registered_ones() -> None:
    r = manager(b=1, a=1)
    with pytest.raises(UnknownName) as info:
        r.ensure("zzz")
    assert info.value.kind == "weights"
    assert info.value.accepted == ["a", "b"]
    assert str(info.value) == "unknown weights 'zzz'; accepted: a, b"
    for call in (r.pin, r.unpin, r.is_resident, r.is_pinned, r.loads):
        with pytest.raises(UnknownName):
            call("zzz")
