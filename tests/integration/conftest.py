"""One local Ray per test session; a rack of two node agents served over gRPC; the
control plane (an orchestrator in this process, served on a free port) on them, one per
test module."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import ray

from rdurack.api.job_service import JOB_SERVICE, JobService
from rdurack.api.node_gateway import GrpcNodeGateway
from rdurack.api.rack_service import SERVICE as RACK_SERVICE
from rdurack.api.rack_service import RackService
from rdurack.api.server import Server, channel
from rdurack.node_agent.actors import start_ray
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.presets import platform
from rdurack.v1 import job_pb2_grpc, rack_pb2_grpc
from tests.support.agents import ServedAgent, start_agents, stop_agents
from tests.support.control import PLATFORM, Control, drain, release_held


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    start_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def rack(ray_session: None) -> Iterator[list[ServedAgent]]:
    """Two node agents x 8 sockets of the sn40l-rack16 platform."""
    served = start_agents(platform("sn40l-rack16"), link_timeout_s=5.0)
    yield served
    stop_agents(served)


@pytest.fixture(scope="module")
def control(rack: list[ServedAgent], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    """An orchestrator in this process, served on a free port, on the rack's two agents."""
    store = JobStore(tmp_path_factory.mktemp("control") / "jobs.sqlite")
    gateway = GrpcNodeGateway([a.server.address for a in rack])
    orchestrator = Orchestrator(store, gateway, platform(PLATFORM))
    orchestrator.start()
    server: Server | None = None
    ch: grpc.Channel | None = None
    try:
        server = Server(
            [
                (JOB_SERVICE, JobService(orchestrator).add_to),
                (RACK_SERVICE, RackService(orchestrator).add_to),
            ]
        )
        ch = channel(server.address)
        stub = job_pb2_grpc.JobServiceStub(ch)
        yield Control(orchestrator, server, ch, stub, rack_pb2_grpc.RackServiceStub(ch))
        drain(stub, timeout_s=30)
    finally:
        if ch is not None:
            ch.close()
        if server is not None:
            server.stop(0)
        orchestrator.stop()
        gateway.close()
        ids = [j.id for j in store.list()]
        store.close()
        release_held(rack, ids)
