"""AdminService on the wire, over an in-memory gateway (no Ray): admin tokens only (a
tokens file's admin tenant), proper status codes for bad input, and `rdu fault` run as a
user does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from rdurack.api.admin_service import SERVICE, AdminService
from rdurack.api.server import Server, channel
from rdurack.client.admin import AdminClient
from rdurack.orchestrator.fault_injector import FaultInjector
from rdurack.security.auth import Authenticator
from rdurack.v1 import admin_pb2, admin_pb2_grpc
from tests.support.cli import rdu
from tests.support.fake_rack import RACK, FakeGateway
from tests.support.tokens import TOKENS, write_tokens

TOKEN = TOKENS["ops"]  # the admin tenant of test_security's tokens file


@dataclass
class Served:
    address: str
    gateway: FakeGateway
    channel: grpc.Channel  # no token: each test says who calls
    tokens: Path

    def client(self, tenant: str = "ops") -> AdminClient:
        return AdminClient(channel(self.address, token=TOKENS[tenant]))


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[Served]:
    gateway = FakeGateway()
    tokens = write_tokens(tmp_path / "tokens.yaml")
    auth = Authenticator.from_file(tokens)
    service = AdminService(FaultInjector(gateway, RACK), auth)
    server = Server([(SERVICE, service.add_to)], auth=auth)
    ch = channel(server.address)
    try:
        yield Served(server.address, gateway, ch, tokens)
    finally:
        ch.close()
        server.stop(0)


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()  # type: ignore[operator]
    err = e.value
    assert isinstance(err, grpc.Call)
    return err.code(), err.details() or ""


def test_no_token_or_a_wrong_one_is_unauthenticated_and_injects_nothing(admin: Served) -> None:
    stub = admin_pb2_grpc.AdminServiceStub(admin.channel)
    request = admin_pb2.KillSocketRequest(socket_id="rdu-n0-s1")
    code, details = code_of(lambda: stub.KillSocket(request, timeout=10))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in details
    for metadata in (
        (("authorization", "Bearer not-the-token"),),
        (("authorization", f"Basic {TOKEN}"),),
        (("authorization", "Bearer "),),
    ):
        code, _ = code_of(lambda m=metadata: stub.KillSocket(request, timeout=10, metadata=m))
        assert code == grpc.StatusCode.UNAUTHENTICATED, metadata
    assert admin.gateway.in_force == {0: {}, 1: {}}


def test_a_tenant_that_is_not_an_admin_is_refused_and_injects_nothing(admin: Served) -> None:
    code, details = code_of(lambda: admin.client("alice").kill_socket("rdu-n0-s1"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not an admin" in details
    code, _ = code_of(lambda: admin.client("bob").faults())
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert admin.gateway.in_force == {0: {}, 1: {}}


def test_an_open_rack_lets_anyone_inject(tmp_path: Path) -> None:
    """The local default (no tokens file) is open for every service, AdminService too:
    what `rdu up` says when it starts."""
    gateway = FakeGateway()
    service = AdminService(FaultInjector(gateway, RACK), Authenticator.open())
    server = Server([(SERVICE, service.add_to)])
    try:
        with channel(server.address) as ch:
            fault = AdminClient(ch).slow("rdu-n0-s1", 2.0)
        assert set(gateway.in_force[0]) == {fault.id}
    finally:
        server.stop(0)


def test_an_admin_injects_lists_and_heals(admin: Served) -> None:
    client = admin.client()
    slow = client.slow("rdu-n1-s2", 3.0)
    link = client.drop_link("rdu-n0-s4", "rdu-n1-s4")
    assert slow.slow_factor == 3.0 and slow.description == "socket rdu-n1-s2 3x slower"
    assert list(link.socket_ids) == ["rdu-n0-s4", "rdu-n1-s4"]
    assert [f.id for f in client.faults()] == [slow.id, link.id]
    assert set(admin.gateway.in_force[0]) == {link.id}
    assert set(admin.gateway.in_force[1]) == {slow.id, link.id}
    healed = client.heal(link.id)
    assert [f.id for f in healed.healed] == [link.id]
    assert [f.id for f in client.faults()] == [slow.id]
    assert [f.id for f in client.heal().healed] == [slow.id]
    assert client.faults() == []


@pytest.mark.parametrize(
    ("call", "code", "text"),
    [
        (lambda c: c.kill_socket("rdu-n7-s0"), grpc.StatusCode.NOT_FOUND, "rdu-n7-s0"),
        (lambda c: c.kill_socket(""), grpc.StatusCode.INVALID_ARGUMENT, "socket_id"),
        (lambda c: c.slow("rdu-n0-s0", 0.5), grpc.StatusCode.INVALID_ARGUMENT, "slow_factor"),
        (lambda c: c.drop_link("rdu-n0-s0", "rdu-n0-s0"), grpc.StatusCode.INVALID_ARGUMENT,
         "socket_b"),
        (lambda c: c.delay_link("rdu-n0-s0", "rdu-n1-s0", 0), grpc.StatusCode.INVALID_ARGUMENT,
         "extra_latency_ns"),
        (lambda c: c.partition(1, 1), grpc.StatusCode.INVALID_ARGUMENT, "node_b"),
        (lambda c: c.kill_agent(5), grpc.StatusCode.NOT_FOUND, "node"),
        (lambda c: c.heal("f-nope"), grpc.StatusCode.NOT_FOUND, "f-nope"),
    ],
)  # fmt: skip
def test_bad_input_gets_its_status_code_naming_the_field(
    admin: Served, call: object, code: grpc.StatusCode, text: str
) -> None:
    client = admin.client()
    got, details = code_of(lambda: call(client))  # type: ignore[operator]
    assert (got, text in details) == (code, True), details


def test_killing_an_unreachable_agent_is_unavailable(admin: Served) -> None:
    admin.gateway.silent.add(1)
    code, details = code_of(lambda: admin.client().kill_agent(1))
    assert code == grpc.StatusCode.UNAVAILABLE and "node 1" in details


# ------------------------------------------------------------------ rdu fault


def test_rdu_fault_injects_lists_and_heals(admin: Served, tmp_path: Path) -> None:
    where = ["--address", admin.address, "--token", TOKEN]
    done = rdu("fault", "kill-socket", "rdu-n0-s3", *where)
    assert done.returncode == 0, done.stderr
    fault_id, kind, *description = done.stdout.split()
    assert kind == "kill-socket" and " ".join(description) == "socket rdu-n0-s3 killed"
    listed = rdu("fault", "list", "--json", *where)
    assert listed.returncode == 0, listed.stderr
    faults = json.loads(listed.stdout)["faults"]
    assert [(f["id"], f["kind"], f["socket_ids"]) for f in faults] == [
        (fault_id, "kill-socket", ["rdu-n0-s3"])
    ]
    healed = rdu("fault", "heal", fault_id, *where, "--state-dir", str(tmp_path))
    assert healed.returncode == 0 and f"healed {fault_id}" in healed.stdout, healed.stderr
    assert rdu("fault", "list", *where).stdout.strip() == "no faults in force"


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["slow", "rdu-n0-s0", "0.5"], "factor"),
        (["delay-link", "rdu-n0-s0", "rdu-n1-s0", "0"], "extra_latency_ns"),
        (["kill-agent", "5"], "unknown node"),
        (["partition", "1", "1"], "both are 1"),
        (["kill-socket", "rdu-n9-s9"], "rdu-n9-s9"),
        (["list", "--token", "wrong-token-wrong-token"], "valid bearer token is required"),
        (["list", "--token", TOKENS["alice"]], "not an admin"),
    ],
)
def test_rdu_fault_bad_input_is_one_line_and_exit_2(
    admin: Served, tmp_path: Path, args: list[str], text: str
) -> None:
    token = [] if "--token" in args else ["--token", TOKEN]
    done = rdu("fault", *args, "--address", admin.address, *token)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and text in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_rdu_fault_without_a_token_on_a_secured_rack_is_one_line(admin: Served) -> None:
    done = rdu("fault", "list", "--address", admin.address)
    assert done.returncode == 2 and "bearer token" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
