"""A script's operators priced on the emulated clock, and DDP's streams
(node_agent/training/script_time.py)."""

from __future__ import annotations

import torch

from rdurack.node_agent.training.script_time import Pricing, Streams
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.presets import platform
from rdurack.rack.timing import Timer
from rdurack.rack.topology import SocketId

OP_NS = 100  # every operator takes 100 ns in these tests (the clock may round up 1 ns)


def streams() -> Streams:
    return Streams(EmulatedClock(0), lambda flops, nbytes: OP_NS * 1e-9)


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
    s = Streams(EmulatedClock(0), timer.unfused_s)
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
