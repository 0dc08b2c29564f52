"""`rdu serve --rack` without Ray: the engine's iterations run as passes of an endpoint
job on an orchestrator served over gRPC, whose sockets are real Socket objects
(tests/support/socket_rack.py). The times equal the predictor's replay; the sockets'
clocks, HBM and spans show the work; a rack that cannot run a pass answers 503."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from math import ceil
from pathlib import Path

import grpc
import httpx
import pytest

from rdurack.api.job_service import JOB_SERVICE, JobService
from rdurack.api.server import Server, channel
from rdurack.endpoint.app import create_app
from rdurack.endpoint.engine import UNAVAILABLE_FOR_S, Engine, Handle
from rdurack.endpoint.rack import RackModel
from rdurack.endpoint.server import engines, on_rack
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.models import builtin_models
from rdurack.rack.spec import Tier
from rdurack.rack.topology import SocketId
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, serve_pb2
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.bundle import BUNDLE_NAME, BundleLayout, BundleSetting
from rdurack.workloads.serving.stream.pricing import Pass
from rdurack.workloads.serving.stream.replay import StreamSetting, prepare, replay
from rdurack.workloads.serving.stream.scheduler import Policy
from tests.support.endpoint import in_thread
from tests.support.fake_rack import RACK, until
from tests.support.ports import free_port
from tests.support.socket_rack import SocketGateway
from tests.unit.endpoint.test_engine import MODEL, _all

SETTING = StreamSetting(MODEL, 8, Policy.CONTINUOUS, max_batch=4)


def bundle_layout(setting: StreamSetting) -> BundleLayout:
    """The layout the endpoint's bundle asks its sockets to hold."""
    pricer, _ = prepare(Predictor(RACK), setting, builtin_models())
    assert pricer.bundle is not None
    return pricer.bundle.layout


@dataclass
class Rack:
    orchestrator: Orchestrator
    gateway: SocketGateway
    channel: grpc.Channel


@pytest.fixture
def rack(tmp_path: Path) -> Iterator[Rack]:
    """An orchestrator on Socket objects, its JobService on a free port."""
    gateway = SocketGateway()
    o = Orchestrator(JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, heartbeat_s=None)
    o.start()
    server = Server([(JOB_SERVICE, JobService(o).add_to)])
    ch = channel(server.address)
    try:
        yield Rack(o, gateway, ch)
    finally:
        ch.close()
        server.stop(0)
        o.stop()
        gateway.close()
        o.store.close()


def _on_rack(rack: Rack, time_scale: float = 0.0) -> tuple[Engine, RackModel]:
    served = engines(
        Predictor(RACK), [MODEL], SETTING, builtin_models(), time_scale, rack=rack.channel
    )
    (model,) = on_rack(served)
    model.hold()
    return served[MODEL], model


async def _times(
    engine: Engine, submit: Sequence[Callable[[], Handle]]
) -> list[tuple[Arrival, list[float]]]:
    """Each request submitted in turn, then served to the end: its arrival and the
    emulated times of its tokens."""
    handles = [s() for s in submit]
    engine.start()
    try:
        out = []
        for h in handles:
            times = []
            while (t := await h.tokens.get()) is not None:
                times.append(t.emulated_s)
            out.append((h.arrival, times))
        return out
    finally:
        await engine.stop()


def test_the_passes_run_on_the_sockets_and_time_as_the_predictors_replay(rack: Rack) -> None:
    engine, model = _on_rack(rack)
    assert model.job_id is not None
    job = rack.orchestrator.get(model.job_id)
    assert job.state is JobState.RUNNING and len(job.sockets) == 8
    lengths = [(300, 20), (1200, 5), (64, 40), (700, 12), (90, 9), (2000, 3)]
    got = asyncio.run(_all(engine, lengths))
    arrivals = [Arrival(i, 0.0, p, o) for i, (p, o) in enumerate(lengths)]
    want = replay(Predictor(RACK), SETTING, arrivals, builtin_models())
    ttft = sorted(t[0].emulated_s for t in got)
    e2e = sorted(t[-1].emulated_s for t in got)
    # Each pass is whole ns on the sockets' clocks: at most 0.5 ns off per pass.
    assert ttft[-1] == pytest.approx(want.ttft_s.max, rel=1e-6)
    assert e2e[-1] == pytest.approx(want.e2e_s.max, rel=1e-6)
    assert sum(e2e) / len(e2e) == pytest.approx(want.e2e_s.mean, rel=1e-6)

    speaker = rack.gateway.speakers[SocketId.parse(job.sockets[0]).node]
    assert job.emulated_start_ns is not None
    assert speaker.clock.now_ns - job.emulated_start_ns == pytest.approx(
        want.e2e_s.max * 1e9, rel=1e-6
    )
    held = {a.name.split("/", 1)[1]: a for a in speaker.memory.allocations()}
    assert held[f"weights/{MODEL}"].tier is Tier.HBM
    # The last pass ran with its last request's cache held: then nothing else runs.
    kv = [a for name, a in held.items() if name.startswith(f"kv/{MODEL}/")]
    assert len(kv) == 1 and kv[0].tier is Tier.HBM

    model.release()
    until(lambda: rack.orchestrator.get(job.id).state is JobState.CANCELLED, "released")


def test_a_bundle_runs_on_the_sockets_and_times_as_the_predictors_replay(rack: Rack) -> None:
    bundle = StreamSetting(BUNDLE_NAME, 8, Policy.CONTINUOUS, 4, bundle=BundleSetting(150))
    served = engines(
        Predictor(RACK), [], SETTING, builtin_models(), 0.0, rack=rack.channel, bundle=bundle
    )
    (model,) = on_rack(served)
    model.hold()
    assert model.job_id is not None
    job = rack.orchestrator.get(model.job_id)
    assert job.state is JobState.RUNNING and len(job.sockets) == 8
    engine = served[BUNDLE_NAME]
    asks = [("coding-python", True), ("math-algebra", False), ("coding-python", False)]
    arrivals = [Arrival(i, 0.0, 200, 6, e, r) for i, (e, r) in enumerate(asks)]

    submit = [lambda a=a: engine.submit(200, 6, None, a.expert, a.routed) for a in arrivals]
    got = [t for _, t in asyncio.run(asyncio.wait_for(_times(engine, submit), 60))]
    want = replay(Predictor(RACK), bundle, arrivals, builtin_models())
    assert want.switches == 2  # coding-python (both of its requests), then math-algebra
    assert max(t[0] for t in got) == pytest.approx(want.ttft_s.max, rel=1e-6)
    assert max(t[-1] for t in got) == pytest.approx(want.e2e_s.max, rel=1e-6)
    speaker = rack.gateway.speakers[SocketId.parse(job.sockets[0]).node]
    held = {a.name.split("/", 1)[1]: a for a in speaker.memory.allocations()}
    layout = bundle_layout(bundle)
    assert held["router"].tier is Tier.HBM and held["experts"].tier is Tier.DDR
    assert held["region"].nbytes == layout.region_experts * ceil(
        builtin_models()["llama2-7b"].weight_bytes / 8
    )
    assert "weights/llama2-7b" not in held  # the experts are in the region, not weights
    model.release()
    until(lambda: rack.orchestrator.get(job.id).state is JobState.CANCELLED, "released")


def test_a_rack_that_cannot_run_a_pass_answers_503_until_it_can(rack: Rack) -> None:
    engine, model = _on_rack(rack)
    assert model.job_id is not None
    node = SocketId.parse(rack.orchestrator.get(model.job_id).sockets[0]).node
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}
    with (
        in_thread(create_app({MODEL: engine}), free_port()) as url,
        httpx.Client(base_url=url) as c,
    ):
        assert c.post("/v1/completions", json=body).status_code == 200
        rack.gateway.fail_node = node
        down = c.post("/v1/completions", json=body)
        assert down.status_code == 503, down.text
        assert "the rack did not run its pass" in down.json()["error"]["message"]
        assert down.headers["Retry-After"] == str(int(UNAVAILABLE_FOR_S))
        again = c.post("/v1/completions", json=body)  # at once: no call to the rack
        assert again.status_code == 503
        rack.gateway.fail_node = None
        until(lambda: c.post("/v1/completions", json=body).status_code == 200, "served again", 30)
        assert (engine.running, engine.waiting, engine.scheduler.reserved_tokens) == (0, 0, 0)
    model.release()


def test_bad_passes_are_refused_by_name(rack: Rack) -> None:
    jobs = job_pb2_grpc.JobServiceStub(rack.channel)
    _, model = _on_rack(rack)
    assert model.job_id is not None
    good = serve_pb2.ServePass(
        plan=common_pb2.FUSION_PLAN_KERNEL_LOOPED,
        shapes=[serve_pb2.PassShape(batch=2, new_tokens=1, context=4)],
        logits=2,
    )
    bad = serve_pb2.ServePass(
        plan=common_pb2.FUSION_PLAN_KERNEL_LOOPED,
        shapes=[serve_pb2.PassShape(batch=2, new_tokens=8, context=4)],
        logits=2,
    )
    cases = [
        (model.job_id, [bad], grpc.StatusCode.INVALID_ARGUMENT, "passes[0].shapes[0]: "),
        (model.job_id, [], grpc.StatusCode.INVALID_ARGUMENT, "passes: at least one"),
        ("0123456789ab", [good], grpc.StatusCode.NOT_FOUND, "0123456789ab"),
    ]
    for job_id, passes, code, message in cases:
        with pytest.raises(grpc.RpcError) as e:
            jobs.RunPasses(job_pb2.RunPassesRequest(job_id=job_id, passes=passes), timeout=30)
        assert e.value.code() == code and message in (e.value.details() or "")
    model.release()


def test_calls_carry_several_planned_iterations_when_one_would_make_tokens_late(
    rack: Rack,
) -> None:
    """At a time scale where an iteration lasts less wall than a call to the rack, a
    call carries several iterations, planned with the timing model, and the times are
    still the predictor's."""
    engine, model = _on_rack(rack, time_scale=0.02)
    sizes: list[int] = []
    run = engine.executor

    async def counted(its: Sequence[Pass], start_s: float) -> list[float]:
        sizes.append(len(its))
        return await run(its, start_s)

    engine.executor = counted
    lengths = [(300, 60), (1200, 25), (64, 80), (700, 40)]

    submit = [lambda p=p, o=o: engine.submit(p, o) for p, o in lengths]
    got = asyncio.run(_times(engine, submit))
    assert max(sizes) > 1, sizes
    assert [len(t) for _, t in got] == [o for _, o in lengths]
    # The arrivals as the engine stamped them (wall time / time scale), replayed.
    want = replay(Predictor(RACK), SETTING, [a for a, _ in got], builtin_models())
    e2e = [t[-1] - a.at_s for a, t in got]
    ttft = [t[0] - a.at_s for a, t in got]
    assert max(e2e) == pytest.approx(want.e2e_s.max, rel=1e-6)
    assert sum(e2e) / len(e2e) == pytest.approx(want.e2e_s.mean, rel=1e-6)
    assert sum(ttft) / len(ttft) == pytest.approx(want.ttft_s.mean, rel=1e-6)
    model.release()
