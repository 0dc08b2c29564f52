"""An endpoint on a rack whose orchestrator has two replicas: it may reach either. The
follower stores its endpoint job for the leader, which runs it, and forwards its passes
to the leader with the caller's token, over the rack's TLS (api/forward.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from rdurack.api.forward import FORWARDED
from rdurack.api.job_service import serve_api
from rdurack.api.server import Server, channel
from rdurack.endpoint.server import engines, on_rack
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.models import builtin_models
from rdurack.security.auth import Authenticator
from rdurack.v1 import job_pb2, job_pb2_grpc
from rdurack.workloads.predictor import Predictor
from tests.support.certs import RackCerts
from tests.support.fake_rack import RACK, spec, until
from tests.support.ports import free_port
from tests.support.socket_rack import SocketGateway
from tests.support.tokens import TOKENS, write_tokens
from tests.unit.endpoint.test_engine import MODEL, _all
from tests.unit.endpoint.test_on_rack import SETTING

Replica = tuple[Orchestrator, Server]


@pytest.fixture
def replicas(tmp_path: Path, rack_certs: RackCerts) -> Iterator[tuple[Replica, Replica]]:
    """A leader and a follower on one job store and one rack of Socket objects, each
    serving its API with TLS and tokens, named by its address."""
    gateway = SocketGateway()
    auth = Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml"))
    with ExitStack() as stack:
        stack.callback(gateway.close)
        served = []
        for _ in range(2):
            port = free_port()
            store = JobStore(tmp_path / "jobs.sqlite")
            stack.callback(store.close)
            o = Orchestrator(store, gateway, RACK, heartbeat_s=None, replica=f"127.0.0.1:{port}")
            o.start()
            stack.callback(o.stop)
            server = serve_api(o, auth, port=port, tls=rack_certs.member)
            stack.callback(server.stop, 0)
            served.append((o, server))
        leader, follower = served
        assert leader[0].leading and not follower[0].leading
        yield leader, follower


def test_an_endpoint_served_through_the_follower_runs_on_the_leader(
    replicas: tuple[Replica, Replica], rack_certs: RackCerts
) -> None:
    (leader, _), (follower, server) = replicas
    with channel(server.address, tls=rack_certs.client, token=TOKENS["alice"]) as ch:
        served = engines(Predictor(RACK), [MODEL], SETTING, builtin_models(), rack=ch)
        (model,) = on_rack(served)
        job_id = model.hold()
        job = leader.get(job_id)
        assert job.state is JobState.RUNNING and job.tenant == "alice"
        got = asyncio.run(_all(served[MODEL], [(300, 5), (64, 9)]))
        assert [len(tokens) for tokens in got] == [5, 9]  # every pass ran, forwarded
        assert leader.get(job_id).emulated_start_ns is not None
        model.release()
    until(lambda: follower.get(job_id).state is JobState.CANCELLED, "released")


def test_a_forwarded_call_is_not_forwarded_again(
    replicas: tuple[Replica, Replica], rack_certs: RackCerts
) -> None:
    (leader, _), (follower, server) = replicas
    job, _ = follower.submit(spec(sockets=1, steps=1), tenant="alice")
    with channel(server.address, tls=rack_certs.client, token=TOKENS["alice"]) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.RunPasses(
                job_pb2.RunPassesRequest(job_id=job.id),
                metadata=((FORWARDED, "1"),),
                timeout=30,
            )
    assert isinstance(e.value, grpc.Call)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"does not lead; {leader.elector.holder} does" in (e.value.details() or "")
