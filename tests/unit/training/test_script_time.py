"""A script's operators priced on the emulated clock, DDP's streams, and the memory its
tensors hold (node_agent/training/script_time.py, script_memory.py)."""

from __future__ import annotations

import pytest
import torch

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.node_agent.training.script_kernels import Fused, Unfused
from rdurack.node_agent.training.script_memory import TensorMemory
from rdurack.node_agent.training.script_time import Pricing, Streams
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.memory import TieredMemory
from rdurack.rack.presets import platform
from rdurack.rack.timing import Timer
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.memory import MemoryAccount

OP_NS = 100  # every operator takes 100 ns in these tests (the clock may round up 1 ns)


class EachOp:
    """Every operator a kernel of OP_NS."""

    def add(self, flops: float, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
        return OP_NS * 1e-9

    def flush(self) -> float:
        return 0.0


def streams() -> Streams:
    return Streams(EmulatedClock(0), EachOp())


def test_matmuls_count_their_flops_and_views_cost_nothing() -> None:
    s = streams()
    a, b = torch.ones(4, 8), torch.ones(8, 2)
    with Pricing(s):
        a.t()  # a view: no kernel
        a.view(8, 4)
        a @ b  # 2 x 4 x 8 x 2 FLOPs
        a.add_(1.0)  # in place: a kernel that reads and writes a
    assert s.flops == 128 and s.operators == 2
    assert s.clock.now_ns == s.compute_ns and 2 * OP_NS <= s.compute_ns <= 2 * OP_NS + 2


def test_an_operator_costs_the_sockets_unfused_roofline() -> None:
    rack = platform("sn40l-rack16")
    timer = Timer(rack, [SocketId.parse("rdu-n0-s0")])
    s = Streams(EmulatedClock(0), Unfused(timer))
    a = torch.ones(512, 512)
    with Pricing(s):
        a @ a
    k = rack.socket.kernels
    flops_s = 2 * 512**3 / (rack.socket.peak_flops_per_s * k.compute_efficiency)
    bytes_s = 3 * a.nbytes / (rack.socket.hbm.bandwidth_bytes_per_s * k.memory_efficiency)
    expected = k.launch_so_ns * 1e-9 + max(flops_s, bytes_s)
    assert abs(s.compute_ns * 1e-9 - expected) <= 1e-9  # the clock rounds up to ns


def test_a_gradient_all_reduce_runs_beside_backward_and_the_rest_is_exposed() -> None:
    s = streams()
    w = torch.ones(3, requires_grad=True)
    comm_ns = 10_000

    def all_reduce(grad: torch.Tensor) -> torch.Tensor:
        with s.collective("all_reduce") as clock:  # as DDP's bucket hook issues it
            assert clock is not s.clock
            clock.advance(comm_ns * 1e-9)
        return grad

    with Pricing(s):
        h = w * 2.0
        h.register_hook(all_reduce)  # type: ignore[no-untyped-call]  # backward still computes w's gradient after it
        loss = (h * 3.0).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        before = s.clock.now_ns
        w.detach().mul_(0.5)  # the first operator after backward waits for the stream
    assert s.all_reduce_ns == comm_ns
    assert 0 < s.exposed_ns <= comm_ns - OP_NS  # backward's last operator hid some of it
    assert 0 <= s.clock.now_ns - (before + s.exposed_ns + OP_NS) <= 1


def test_optimizer_steps_are_counted_and_timed() -> None:
    s = streams()
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    with Pricing(s):
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()  # type: ignore[no-untyped-call]
            opt.step()
    assert s.steps == 3
    assert s.step_s() >= 5 * OP_NS * 1e-9  # at least forward, backward and update
    # Outside a job, no hook is left behind.
    opt.step()
    assert s.steps == 3


def account(cap: int = 0) -> MemoryAccount:
    rack = platform("sn40l-rack16")
    return MemoryAccount(TieredMemory("rdu-n0-s0", rack.socket), "job/train/", cap)


def test_memory_is_measured_from_the_tensors_the_step_holds() -> None:
    s, mem = streams(), TensorMemory(account())
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    net[0].requires_grad_(False)  # frozen: not a weight the step trains
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad])
    with Pricing(s, mem):
        for _ in range(2):
            opt.zero_grad()
            net(torch.ones(16, 32)).sum().backward()
            opt.step()
    trained = 4 * (64 * 8 + 8)  # the last layer's weight and bias, float32
    parts = mem.breakdown()
    assert parts["weights"] == trained + 4 * (32 * 64 + 64)  # the frozen layer's too
    assert parts["gradients"] == trained
    # Adam: two moments per weight, and a step counter per tensor.
    assert 2 * trained <= parts["optimizer"] <= 2 * trained + 2 * 8
    # Saved for backward: the ReLU's output (16 x 64), what the last Linear reads.
    assert parts["activations"] == 4 * 16 * 64
    assert parts["total"] == sum(
        parts[p] for p in ("weights", "gradients", "optimizer", "activations")
    )


def test_a_step_that_outgrows_the_jobs_cap_fails_with_out_of_memory() -> None:
    s, mem = streams(), TensorMemory(account(cap=1000))
    net = torch.nn.Linear(1000, 1)  # 4,004 bytes of weights
    with pytest.raises(OutOfMemory, match="cap of 1,000 bytes"), Pricing(s, mem):
        net(torch.ones(1, 1000)).sum().backward()


def test_fused_kernels_keep_intermediates_on_chip_and_end_at_sync_points() -> None:
    rack = platform("sn40l-rack16")
    timer = Timer(rack, [SocketId.parse("rdu-n0-s0")])
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
    x = torch.ones(64, 256)

    def step(kernels: Unfused | Fused) -> Streams:
        s = Streams(EmulatedClock(0), kernels)
        with Pricing(s):
            net(x).sum().backward()
        return s

    unfused = step(Unfused(timer))
    fused_kernels = Fused(timer, FusionPlan.FUSED_HO, rack.socket.sram.capacity_bytes)
    fused = step(fused_kernels)
    assert fused.flops == unfused.flops > 0  # the same work
    # Forward, then backward: two kernels, not one per operator.
    assert fused_kernels.kernels == 2 and unfused.operators > 10
    assert fused.compute_ns < unfused.compute_ns


def test_a_fused_kernel_that_outgrows_sram_spills_into_the_next() -> None:
    rack = platform("sn40l-rack16")
    timer = Timer(rack, [SocketId.parse("rdu-n0-s0")])
    small = Fused(timer, FusionPlan.FUSED_HO, sram_bytes=4 * 64 * 64)  # one 64 x 64 output
    s = Streams(EmulatedClock(0), small)
    a = torch.ones(64, 64)
    with Pricing(s):
        (a @ a) @ a  # two outputs of 16 KiB each: the second does not fit with the first
    assert small.kernels == 2


def test_a_gpu_runs_no_fused_kernels() -> None:
    timer = Timer(platform("dgx-h100"), [SocketId.parse("rdu-n0-s0")])
    with pytest.raises(InvalidRequest, match="no dataflow kernels"):
        timer.fused_s(1.0, 1.0, FusionPlan.FUSED_SO)
