"""TieredMemory: per-socket allocation, overflow errors, peaks and copies between tiers."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.memory import Allocation, MemorySnapshot, TieredMemory, TierUsage
from rdurack.rack.presets import platform
from rdurack.rack.spec import Tier

SN40L = platform("sn40l-node").socket

GB = 1_000_000_000
HBM_CAPACITY = 64 * GB  # SN40L preset, PAPER Table II
HBM_BW = 1.8e12
DDR_BW = 200e9


@pytest.fixture
def mem() -> TieredMemory:
    return TieredMemory("rdu-n0-s3", SN40L)


def test_capacities_come_from_the_spec(mem: TieredMemory) -> None:
    assert mem.capacity_bytes(Tier.SRAM) == 520_000_000
    assert mem.capacity_bytes(Tier.HBM) == HBM_CAPACITY
    assert mem.capacity_bytes(Tier.DDR) == 1_500_000_000_000
    for tier in Tier:
        assert mem.used_bytes(tier) == 0
        assert mem.free_bytes(tier) == mem.capacity_bytes(tier)


def test_allocate_and_free_account_bytes_per_tier(mem: TieredMemory) -> None:
    a = mem.allocate("weights", Tier.HBM, 10 * GB)
    assert a == Allocation(name="weights", tier=Tier.HBM, nbytes=10 * GB)
    mem.allocate("kv", Tier.HBM, 5 * GB)
    mem.allocate("catalog", Tier.DDR, 300 * GB)

    assert mem.used_bytes(Tier.HBM) == 15 * GB
    assert mem.free_bytes(Tier.HBM) == HBM_CAPACITY - 15 * GB
    assert mem.used_bytes(Tier.DDR) == 300 * GB
    assert mem.used_bytes(Tier.SRAM) == 0
    assert "weights" in mem
    assert mem.get("kv").nbytes == 5 * GB
    assert [x.name for x in mem.allocations()] == ["weights", "kv", "catalog"]
    assert [x.name for x in mem.allocations(Tier.HBM)] == ["weights", "kv"]

    assert mem.free("weights") == a
    assert "weights" not in mem
    assert mem.used_bytes(Tier.HBM) == 5 * GB
    assert [x.name for x in mem.allocations(Tier.HBM)] == ["kv"]


def test_a_tier_can_be_filled_exactly(mem: TieredMemory) -> None:
    mem.allocate("all", Tier.HBM, HBM_CAPACITY)
    assert mem.free_bytes(Tier.HBM) == 0
    mem.allocate("nothing", Tier.HBM, 0)  # zero bytes always fit
    with pytest.raises(OutOfMemory):
        mem.allocate("one-more", Tier.HBM, 1)


def test_peak_is_a_high_water_mark_until_reset(mem: TieredMemory) -> None:
    mem.allocate("a", Tier.HBM, 30 * GB)
    mem.allocate("b", Tier.HBM, 20 * GB)
    mem.free("a")
    mem.allocate("c", Tier.HBM, 10 * GB)
    assert mem.used_bytes(Tier.HBM) == 30 * GB
    assert mem.peak_bytes(Tier.HBM) == 50 * GB
    assert mem.peak_bytes(Tier.DDR) == 0

    mem.reset_peak()
    # After a reset the peak starts from what is in use, not from zero.
    assert mem.peak_bytes(Tier.HBM) == 30 * GB
    mem.free("b")
    assert mem.peak_bytes(Tier.HBM) == 30 * GB
    mem.allocate("d", Tier.HBM, 25 * GB)
    assert mem.peak_bytes(Tier.HBM) == 35 * GB


def test_overflow_names_socket_tier_asked_and_free_and_changes_nothing(
    mem: TieredMemory,
) -> None:
    mem.allocate("weights", Tier.HBM, 60 * GB)
    before = mem.snapshot()

    with pytest.raises(OutOfMemory) as info:
        mem.allocate("kv", Tier.HBM, 5 * GB, what="KV cache of job 7")

    err = info.value
    assert (err.socket, err.tier, err.asked_bytes, err.free_bytes) == (
        "rdu-n0-s3",
        "hbm",
        5 * GB,
        4 * GB,
    )
    message = str(err)
    assert "rdu-n0-s3" in message
    assert "HBM" in message
    assert "5,000,000,000" in message
    assert "4,000,000,000" in message
    assert "KV cache of job 7" in message

    assert mem.snapshot() == before
    assert "kv" not in mem
    assert [a.name for a in mem.allocations()] == ["weights"]


def test_overflow_message_falls_back_to_the_allocation_name(mem: TieredMemory) -> None:
    with pytest.raises(OutOfMemory, match="for huge-buffer"):
        mem.allocate("huge-buffer", Tier.SRAM, 520_000_001)


def test_duplicate_names_are_refused_across_tiers(mem: TieredMemory) -> None:
    mem.allocate("x", Tier.HBM, 1 * GB)
    with pytest.raises(InvalidRequest, match="'x' already exists"):
        mem.allocate("x", Tier.DDR, 1 * GB)
    assert mem.used_bytes(Tier.DDR) == 0
    assert mem.get("x").tier == Tier.HBM


def test_negative_size_is_refused(mem: TieredMemory) -> None:
    with pytest.raises(InvalidRequest, match="negative"):
        mem.allocate("x", Tier.HBM, -1)
    assert "x" not in mem
    with pytest.raises(InvalidRequest):
        mem.copy_time_s(-1, Tier.DDR, Tier.HBM)


def test_unknown_name_lists_existing_ones(mem: TieredMemory) -> None:
    mem.allocate("b", Tier.HBM, 1)
    mem.allocate("a", Tier.DDR, 1)
    with pytest.raises(UnknownName) as info:
        mem.free("zzz")
    assert info.value.kind == "allocation"
    assert info.value.accepted == ["a", "b"]
    assert str(info.value) == "unknown allocation 'zzz'; accepted: a, b"
    with pytest.raises(UnknownName):
        mem.get("zzz")
    with pytest.raises(UnknownName):
        mem.move("zzz", Tier.HBM)


def test_copy_time_is_bytes_over_the_slower_side(mem: TieredMemory) -> None:
    nbytes = 36 * GB
    # DDR (200 GB/s) is slower than HBM (1.8 TB/s): a copy either way runs at DDR speed.
    assert mem.copy_time_s(nbytes, Tier.DDR, Tier.HBM) == pytest.approx(nbytes / DDR_BW)
    assert mem.copy_time_s(nbytes, Tier.HBM, Tier.DDR) == pytest.approx(nbytes / DDR_BW)
    assert mem.copy_time_s(nbytes, Tier.DDR, Tier.HBM) == pytest.approx(0.18)
    # HBM -> SRAM: SRAM is faster, so HBM bounds it.
    assert mem.copy_time_s(nbytes, Tier.HBM, Tier.SRAM) == pytest.approx(nbytes / HBM_BW)


@pytest.mark.parametrize("tier", list(Tier))
def test_copy_within_a_tier_is_free(mem: TieredMemory, tier: Tier) -> None:
    assert mem.copy_time_s(10 * GB, tier, tier) == 0.0


def test_ddr_to_hbm_path_bounds_the_copy_when_it_is_slower() -> None:
    slow_path = SN40L.model_copy(update={"ddr_to_hbm_bandwidth_bytes_per_s": 50e9})
    mem = TieredMemory("s0", slow_path)
    assert mem.copy_time_s(100 * GB, Tier.DDR, Tier.HBM) == pytest.approx(2.0)
    assert mem.copy_time_s(100 * GB, Tier.HBM, Tier.DDR) == pytest.approx(2.0)
    # The DDR<->HBM path does not apply to SRAM copies.
    assert mem.copy_time_s(100 * GB, Tier.DDR, Tier.SRAM) == pytest.approx(100 * GB / DDR_BW)


def test_move_between_tiers_returns_copy_time_and_moves_bytes(mem: TieredMemory) -> None:
    nbytes = 20 * GB
    mem.allocate("expert-3", Tier.DDR, nbytes)

    seconds = mem.move("expert-3", Tier.HBM)

    assert seconds == pytest.approx(nbytes / DDR_BW)  # 0.1 s
    assert seconds == mem.copy_time_s(nbytes, Tier.DDR, Tier.HBM)
    assert mem.get("expert-3") == Allocation("expert-3", Tier.HBM, nbytes)
    assert mem.used_bytes(Tier.DDR) == 0
    assert mem.used_bytes(Tier.HBM) == nbytes
    assert mem.peak_bytes(Tier.HBM) == nbytes
    assert mem.peak_bytes(Tier.DDR) == nbytes  # it was there before the move

    assert mem.move("expert-3", Tier.HBM) == 0.0
    assert mem.used_bytes(Tier.HBM) == nbytes


def test_move_without_room_raises_and_leaves_the_block_in_place(mem: TieredMemory) -> None:
    mem.allocate("resident", Tier.HBM, 50 * GB)
    mem.allocate("expert", Tier.DDR, 20 * GB)
    before = mem.snapshot()

    with pytest.raises(OutOfMemory) as info:
        mem.move("expert", Tier.HBM)

    assert info.value.tier == "hbm"
    assert info.value.asked_bytes == 20 * GB
    assert info.value.free_bytes == 14 * GB
    assert mem.get("expert").tier == Tier.DDR
    assert mem.snapshot() == before


def test_snapshot_reports_every_tier_and_does_not_follow_later_changes(
    mem: TieredMemory,
) -> None:
    mem.allocate("a", Tier.SRAM, 100)
    mem.allocate("b", Tier.HBM, 2 * GB)
    mem.free("b")
    snap = mem.snapshot()

    assert isinstance(snap, MemorySnapshot)
    assert snap.socket_id == "rdu-n0-s3"
    assert set(snap.tiers) == set(Tier)
    assert snap.tiers[Tier.SRAM] == TierUsage(100, 100, 520_000_000)
    assert snap.tiers[Tier.HBM] == TierUsage(0, 2 * GB, HBM_CAPACITY)
    assert snap.tiers[Tier.HBM].free_bytes == HBM_CAPACITY

    mem.allocate("c", Tier.HBM, 1 * GB)
    assert snap.tiers[Tier.HBM].used_bytes == 0
    with pytest.raises(TypeError):
        snap.tiers[Tier.HBM] = TierUsage(0, 0, 0)  # type: ignore[index]
