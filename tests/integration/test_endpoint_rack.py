"""`rdu serve --rack` on the real cluster (Ray socket actors, node agents over gRPC, the
orchestrator's JobService): a model's endpoint job holds its sockets, the engine's
iterations run on them as passes, and its requests' emulated times are the predictor's
replay; the sockets' clocks and HBM show the work until the endpoint releases them."""

from __future__ import annotations

import asyncio

import pytest

from rdurack.endpoint.server import engines, on_rack
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2, rack_pb2
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.scheduler import Policy
from tests.support.control import PLATFORM, Control, wait_terminal
from tests.unit.endpoint.test_engine import _all

MODEL = "llama3.1-8b"


def _sockets(control: Control, job_id: str) -> list[rack_pb2.SocketStatus]:
    rack = control.racks.GetRack(rack_pb2.GetRackRequest(), timeout=30).rack
    return [s for n in rack.nodes for s in n.sockets if s.current_job_id == job_id]


def test_an_endpoint_serves_on_the_racks_sockets(control: Control) -> None:
    p = Predictor(platform(PLATFORM))
    setting = StreamSetting(MODEL, 2, Policy.CONTINUOUS, max_batch=8)
    served = engines(p, [MODEL], setting, builtin_models(), 0.0, rack=control.channel)
    (model,) = on_rack(served)
    job_id = model.hold()
    before = {s.ref.id: s.emulated_clock_ns for s in _sockets(control, job_id)}
    assert len(before) == 2

    lengths = [(500, 16), (120, 30), (2000, 4), (64, 9)]
    got = asyncio.run(_all(served[MODEL], lengths))
    want = replay(p, setting, [Arrival(i, 0.0, a, b) for i, (a, b) in enumerate(lengths)],
                  builtin_models())  # fmt: skip
    e2e = sorted(t[-1].emulated_s for t in got)
    assert e2e[-1] == pytest.approx(want.e2e_s.max, rel=1e-6)
    assert sum(t[0].emulated_s for t in got) / 4 == pytest.approx(want.ttft_s.mean, rel=1e-6)

    after = _sockets(control, job_id)
    for s in after:  # each socket ran every pass: its clock moved by the whole stream
        assert s.emulated_clock_ns - before[s.ref.id] >= round(want.e2e_s.max * 1e9) - 100
        hbm = next(t for t in s.tiers if t.tier == common_pb2.TIER_HBM)
        assert hbm.used_bytes > p.platform.socket.hbm.capacity_bytes * 0.05  # weights, 1/2

    model.release()
    assert wait_terminal(control.jobs, [job_id])[job_id].state == common_pb2.JOB_STATE_CANCELLED
