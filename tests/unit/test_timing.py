"""The timing model: units, roofline corners, monotonicity, fusion plans."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.rack.kernels import Block, FusionPlan, Op, OpKind, Phase, step
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.timing import Timer, tp_group

NODE = platform("sn40l-node")
SOCKET = NODE.socket
K = SOCKET.kernels
M = model("llama2-7b")


def timer(p: PlatformSpec = NODE, sockets: int = 8) -> Timer:
    return Timer(p, tp_group(p, sockets))


def test_roofline_corners_in_seconds() -> None:
    t = timer()
    flops_per_s = SOCKET.peak_flops_per_s * K.compute_efficiency
    bytes_per_s = SOCKET.hbm.bandwidth_bytes_per_s * K.memory_efficiency
    # Memory-bound: 1.8 GB at ~1.66 TB/s is about a millisecond.
    assert t.roofline_s(1.0, 1.8e9) == pytest.approx(1.8e9 / bytes_per_s)
    assert 1e-3 < t.roofline_s(1.0, 1.8e9) < 1.2e-3
    # Compute-bound: 1 PFLOP at ~350 TFLOP/s is about three seconds.
    assert t.roofline_s(1e15, 1.0) == pytest.approx(1e15 / flops_per_s)
    # The ridge point: both terms equal.
    ridge = flops_per_s / bytes_per_s
    assert t.roofline_s(ridge * 1e9, 1e9) == pytest.approx(1e9 / bytes_per_s)


def test_unfused_operator_pays_a_host_launch() -> None:
    op = Op("scale", OpKind.ELEMENTWISE, 0.0, act_in_bytes=1e6, act_out_bytes=1e6)
    expected = K.launch_so_ns * 1e-9 + 2e6 / (
        SOCKET.hbm.bandwidth_bytes_per_s * K.memory_efficiency
    )
    assert timer().op_s(op) == pytest.approx(expected)


def test_fused_block_overlaps_compute_and_memory() -> None:
    ops = (
        Op("a", OpKind.MATMUL, 1e12, weight_bytes=1e6, act_in_bytes=5e8, act_out_bytes=5e8),
        Op("b", OpKind.ELEMENTWISE, 1e6, act_in_bytes=5e8, act_out_bytes=5e8),
    )
    block = Block("blk", ops, tokens=1, in_bytes=1e3, out_bytes=1e3)
    t = timer()
    fused = t.fused_block_s(block, FusionPlan.FUSED_HO)
    unfused = sum(t.op_s(op) for op in ops)
    compute = 1e12 / (SOCKET.peak_flops_per_s * K.compute_efficiency)
    overhead = (K.launch_ho_ns or 0.0) * 1e-9 + K.pipeline_fill_ns * 1e-9
    assert fused == pytest.approx(overhead + compute)
    assert unfused > fused


@pytest.mark.parametrize("phase", list(Phase))
def test_plans_order_unfused_so_ho(phase: Phase) -> None:
    s = step(M, phase, 1, 2048, 8)
    t = timer()
    times = {plan: t.step(s, plan).total_s for plan in FusionPlan}
    assert times[FusionPlan.UNFUSED] > times[FusionPlan.FUSED_SO] > times[FusionPlan.FUSED_HO]
    assert times[FusionPlan.KERNEL_LOOPED] < times[FusionPlan.FUSED_HO]


def test_kernel_calls_per_plan() -> None:
    s = step(M, Phase.DECODE, 1, 1024, 8)
    t = timer()
    layer_ops = len(next(b for b, _ in s.blocks if b.name == "decoder_layer").ops)
    assert t.step(s, FusionPlan.FUSED_HO).kernel_calls == M.layers + 2  # + embed, head
    assert t.step(s, FusionPlan.KERNEL_LOOPED).kernel_calls == 3
    assert t.step(s, FusionPlan.UNFUSED).kernel_calls == M.layers * layer_ops + 3


def test_decode_time_grows_with_context_and_batch() -> None:
    t = timer()
    base = t.step(step(M, Phase.DECODE, 1, 1024, 8), FusionPlan.KERNEL_LOOPED).total_s
    longer = t.step(step(M, Phase.DECODE, 1, 8192, 8), FusionPlan.KERNEL_LOOPED).total_s
    wider = t.step(step(M, Phase.DECODE, 16, 1024, 8), FusionPlan.KERNEL_LOOPED).total_s
    assert base < longer
    assert base < wider


def test_prefill_scales_with_sockets() -> None:
    rack = platform("sn40l-rack16")
    times = [
        timer(rack, n).step(step(M, Phase.PREFILL, 1, 4096, n), FusionPlan.FUSED_HO).total_s
        for n in (1, 2, 4, 8)
    ]
    assert times == sorted(times, reverse=True)
    assert times[0] / times[3] > 5  # compute-bound: close to linear


def test_decode_is_memory_bound_so_hbm_bandwidth_matters() -> None:
    faster = NODE.overridden(
        {
            "node": {
                "socket": {"hbm": {"bandwidth_bytes_per_s": 2 * SOCKET.hbm.bandwidth_bytes_per_s}}
            }
        },
        "test",
    )
    s = step(model("llama2-70b"), Phase.DECODE, 1, 4096, 8)
    base = timer().step(s, FusionPlan.KERNEL_LOOPED).total_s
    doubled = timer(faster).step(s, FusionPlan.KERNEL_LOOPED).total_s
    assert 1.7 < base / doubled <= 2.0


def test_gpus_run_unfused_only() -> None:
    dgx = platform("dgx-h100")
    s = step(M, Phase.DECODE, 1, 1024, 8)
    assert timer(dgx).step(s, FusionPlan.UNFUSED).total_s > 0
    with pytest.raises(InvalidRequest, match="unfused kernels only"):
        timer(dgx).step(s, FusionPlan.FUSED_HO)


def test_fused_kernel_must_fit_in_sram() -> None:
    tiny = NODE.overridden({"node": {"socket": {"sram": {"capacity_bytes": 1_000_000}}}}, "test")
    s = step(M, Phase.PREFILL, 1, 4096, 8)
    with pytest.raises(OutOfMemory) as err:
        timer(tiny).step(s, FusionPlan.FUSED_HO)
    assert err.value.tier == "sram"
    assert err.value.free_bytes == 1_000_000
    assert "SRAM" in str(err.value)
    # Unfused kernels keep their intermediates in HBM and still run.
    assert timer(tiny).step(s, FusionPlan.UNFUSED).total_s > 0


def test_groups_stay_inside_a_node() -> None:
    rack = platform("sn40l-rack16")
    assert {s.node for s in tp_group(rack, 8)} == {0}
    assert {s.node for s in tp_group(rack, 16)} == {0, 1}
    with pytest.raises(InvalidRequest, match="has 16 sockets"):
        tp_group(rack, 17)
