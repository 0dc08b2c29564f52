"""Agents joining a rack from other hosts (issue 21): the gateway's registration, the
RegisterNode call (admins only), an agent's registration rounds, and `rdu join`'s choice
of nodes. Real gRPC servers on 127.0.0.1; the whole path across hosts is
tests/integration/test_rack_across_hosts.py."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from rdurack.api.job_service import serve_api
from rdurack.api.node_gateway import AWAITING, GrpcNodeGateway
from rdurack.api.rack_service import Joining
from rdurack.api.server import Server
from rdurack.errors import InvalidRequest, RdurackError
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.processes.join import free_nodes
from rdurack.processes.orchestrator_main import _spec_for_joiners
from rdurack.processes.registration import Registration
from rdurack.processes.settings import port_range
from rdurack.rack.presets import platform
from rdurack.security.auth import Authenticator
from rdurack.v1 import node_agent_pb2, rack_pb2
from tests.support.cli import rdu
from tests.support.fake_rack import RACK, FakeGateway
from tests.support.ports import free_port
from tests.support.tokens import TOKENS, write_tokens


def _heartbeat(
    request: node_agent_pb2.HeartbeatRequest, context: grpc.ServicerContext
) -> node_agent_pb2.HeartbeatResponse:
    return node_agent_pb2.HeartbeatResponse(node_index=1, incarnation="live")


@pytest.fixture
def live_agent() -> Iterator[str]:
    """An agent that answers its heartbeat, and nothing else."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(
        _heartbeat,
        request_deserializer=node_agent_pb2.HeartbeatRequest.FromString,
        response_serializer=node_agent_pb2.HeartbeatResponse.SerializeToString,
    )
    service = node_agent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"].full_name
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(service, {"Heartbeat": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def _nobody() -> str:
    """An address where nothing serves."""
    return f"127.0.0.1:{free_port()}"


def test_a_node_no_agent_joined_is_down_and_says_so() -> None:
    gateway = GrpcNodeGateway(["127.0.0.1:1"], platform=platform("sn40l-rack16"))
    try:
        assert gateway.addresses == ["127.0.0.1:1", ""]
        views = gateway.nodes()
        assert not views[1].healthy and AWAITING in views[1].error
        with pytest.raises(RdurackError, match="no node agent has joined"):
            gateway.heartbeat(1, 1.0)
    finally:
        gateway.close()


def test_more_addresses_than_nodes_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="3 node agent addresses for 2 nodes"):
        GrpcNodeGateway(["a:1", "b:1", "c:1"], platform=platform("sn40l-rack16"))


def test_registration_takes_a_free_node_and_refuses_an_answering_agents(live_agent: str) -> None:
    gateway = GrpcNodeGateway([], platform=platform("sn40l-rack16"))
    try:
        assert gateway.register(1, live_agent) is True
        assert gateway.addresses[1] == live_agent
        assert gateway.heartbeat(1, 5.0).incarnation == "live"  # reached at the new address
        assert gateway.register(1, live_agent) is False  # the same again: no change
        with pytest.raises(RdurackError, match=f"served by the agent at {live_agent}"):
            gateway.register(1, _nobody())
        assert gateway.addresses[1] == live_agent
        # A node whose agent is gone is taken by the next one.
        gone = _nobody()
        assert gateway.register(0, gone) is True
        newer = _nobody()
        assert gateway.register(0, newer) is True and gateway.addresses[0] == newer
    finally:
        gateway.close()


@pytest.mark.parametrize(
    ("node", "address", "error"),
    [(2, "127.0.0.1:5", "nodes 0..1"), (0, "nohost", "host:port"), (0, "", "host:port")],
)
def test_registration_refuses_what_is_not_a_node_or_an_address(
    node: int, address: str, error: str
) -> None:
    gateway = GrpcNodeGateway([], platform=platform("sn40l-rack16"))
    try:
        with pytest.raises(InvalidRequest, match=error):
            gateway.register(node, address)
    finally:
        gateway.close()


class _Served:
    def __init__(self, tmp: Path) -> None:
        self.registered: list[tuple[int, str]] = []
        self.auth = Authenticator.from_file(write_tokens(tmp / "tokens.yaml"))
        self.o = Orchestrator(JobStore(tmp / "jobs.sqlite"), FakeGateway(), RACK)
        self.o.start(background=False)
        joining = Joining(self._register, "10.0.0.1:6379", "base: sn40l-rack16\n")
        self.server: Server = serve_api(self.o, self.auth, joining=joining)

    def _register(self, node: int, address: str) -> bool:
        changed = (node, address) not in self.registered
        if changed:
            self.registered.append((node, address))
        return changed

    def close(self) -> None:
        self.server.stop(0)
        self.o.stop()
        self.o.store.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[_Served]:
    s = _Served(tmp_path)
    yield s
    s.close()


def test_agents_register_as_admins_only_and_say_each_change_once(served: _Served) -> None:
    lines: list[str] = []
    tenant = Registration(
        [served.server.address], 1, "10.0.0.2:7000", token=TOKENS["alice"], say=lines.append
    )
    try:
        outcome = tenant.register_once()[served.server.address]
        assert outcome.startswith("PERMISSION_DENIED") and "admin" in outcome
        tenant.register_once()
        assert len(lines) == 1 and "not registered" in lines[0]  # said once, not per round
    finally:
        tenant.stop()
    assert served.registered == []
    admin = Registration(
        [served.server.address], 1, "10.0.0.2:7000", token=TOKENS["ops"], say=lines.append
    )
    try:
        assert admin.register_once() == {served.server.address: "registered"}
        assert admin.register_once() == {served.server.address: "registered"}
    finally:
        admin.stop()
    assert served.registered == [(1, "10.0.0.2:7000")]
    assert lines[1:] == [f"node-agent 1 registered with {served.server.address}"]


def test_the_rack_tells_joiners_its_ray_cluster_and_platform(served: _Served) -> None:
    from rdurack.api.server import channel
    from rdurack.client.rack import RackClient

    with channel(served.server.address, token=TOKENS["bob"]) as ch:
        rack = RackClient(ch).status()
    assert rack.ray_address == "10.0.0.1:6379"
    assert rack.platform_spec == "base: sn40l-rack16\n"


def test_a_server_without_joining_refuses_registration(tmp_path: Path) -> None:
    o = Orchestrator(JobStore(tmp_path / "jobs.sqlite"), FakeGateway(), RACK)
    o.start(background=False)
    server = serve_api(o)
    lines: list[str] = []
    r = Registration([server.address], 0, "10.0.0.2:7000", say=lines.append)
    try:
        outcome = r.register_once()[server.address]
        assert outcome.startswith("FAILED_PRECONDITION") and "no node agents" in outcome
    finally:
        r.stop()
        server.stop(0)
        o.stop()
        o.store.close()


def _status(*nodes: tuple[str, bool]) -> rack_pb2.RackStatus:
    return rack_pb2.RackStatus(
        nodes=[
            rack_pb2.NodeStatus(index=i, agent_address=a, healthy=h)
            for i, (a, h) in enumerate(nodes)
        ]
    )


def test_join_takes_nodes_without_an_agent_first_then_those_whose_agent_is_down() -> None:
    rack = _status(("h0:1", True), ("h1:1", False), ("", False), ("h3:1", True))
    assert free_nodes(rack, 1, "head:1") == [2]
    assert free_nodes(rack, 2, "head:1") == [2, 1]
    with pytest.raises(RdurackError, match=r"has 2 nodes to join \(free: 2, 1\); asked for 3"):
        free_nodes(rack, 3, "head:1")


def test_joiners_get_the_platform_with_its_base(tmp_path: Path) -> None:
    assert _spec_for_joiners("sn40l-rack16", None) == "base: sn40l-rack16\n"
    plain = tmp_path / "plain.yaml"
    plain.write_text("nodes: 3\n")
    assert _spec_for_joiners("sn40l-rack16", plain) == "base: sn40l-rack16\nnodes: 3\n"
    based = tmp_path / "based.yaml"
    based.write_text("base: sn40l-node\nnodes: 3\n")
    assert _spec_for_joiners("sn40l-rack16", based) == "base: sn40l-node\nnodes: 3\n"


def test_rdu_up_local_nodes_needs_head_and_join_needs_a_real_host(tmp_path: Path) -> None:
    done = rdu("up", "--local-nodes", "1", "--state-dir", str(tmp_path))
    assert done.returncode == 2 and "--local-nodes needs --head" in done.stderr
    assert "Traceback" not in done.stderr
    done = rdu("join", "--head", "127.0.0.1:1", "--host", "0.0.0.0", "--state-dir", str(tmp_path))
    assert done.returncode == 2 and "give this host's own address" in done.stderr
    done = rdu("join", "--head", _nobody(), "--host", "127.0.0.1", "--state-dir", str(tmp_path))
    assert done.returncode != 0 and "did not answer" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("text", "ports"), [("", None), ("41000-41063", range(41000, 41064)), ("80-80", range(80, 81))]
)
def test_link_port_ranges_read_as_lo_hi(text: str, ports: range | None) -> None:
    assert port_range(text, "--link-ports") == ports


@pytest.mark.parametrize("text", ["41000", "9-1", "a-b", "0-10", "65000-65536", "1-2-3"])
def test_a_bad_link_port_range_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(RdurackError, match=f"--link-ports '{text}': expected LO-HI"):
        port_range(text, "--link-ports")
