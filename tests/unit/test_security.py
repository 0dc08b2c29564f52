"""Tokens, tenants, quotas and TLS on the orchestrator's API; mutual TLS in the rack.

Real gRPC servers on 127.0.0.1 over an orchestrator with the in-memory gateway.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rdurack.api.job_service import JOB_SERVICE, serve_api
from rdurack.api.server import Server, channel, security_notice
from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import OTHER_TENANT, Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.security.auth import OPEN, Authenticator, load_tokens
from rdurack.security.tls import TlsConfig, tls_from
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc
from tests.support.certs import RackCerts
from tests.support.fake_rack import RACK, FakeGateway, until, wait_for
from tests.support.grpc_calls import call, methods, request_class
from tests.support.tokens import TOKENS, write_tokens


def _health(ch: grpc.Channel) -> Any:
    stub: Any = health_pb2_grpc.HealthStub(ch)  # its stubs lack Check
    return stub


@dataclass
class Served:
    orchestrator: Orchestrator
    gateway: FakeGateway
    server: Server
    tls: TlsConfig

    def stub(self, tenant: str | None) -> job_pb2_grpc.JobServiceStub:
        token = TOKENS[tenant] if tenant else None
        return job_pb2_grpc.JobServiceStub(channel(self.server.address, tls=self.tls, token=token))


@pytest.fixture
def served(tmp_path: Path, rack_certs: RackCerts) -> Iterator[Served]:
    auth = Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml"))
    gateway = FakeGateway()
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, poll_s=0.05, quotas=auth.quotas()
    )
    o.start(background=False)  # the tests run the scheduling rounds they need
    server = serve_api(o, auth, tls=rack_certs.member, health_port=0)
    yield Served(o, gateway, server, rack_certs.client)
    server.stop(0)
    gateway.gate.set()
    o.stop()
    o.store.close()


def kernel(sockets: int = 8, request_id: str = "", steps: int = 4) -> job_pb2.SubmitJobRequest:
    return job_pb2.SubmitJobRequest(
        spec=job_pb2.JobSpec(
            client_request_id=request_id,
            kernel=job_pb2.KernelJob(
                model="llama2-7b",
                phase=common_pb2.PHASE_DECODE,
                sequence_length=128,
                num_sockets=sockets,
                output_tokens=steps,
            ),
        )
    )


def code_of(call_: object) -> tuple[grpc.StatusCode, str]:
    try:
        if isinstance(call_, Iterator):
            list(call_)
        else:
            assert callable(call_)
            call_()
    except grpc.RpcError as e:
        assert isinstance(e, grpc.Call)
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


# ------------------------------------------------------------------ tokens


def test_no_token_and_a_wrong_token_are_refused_alike_on_every_method(served: Served) -> None:
    """Every JobService and RackService method, and reflection: UNAUTHENTICATED, with
    one message that says nothing about why; health stays open."""
    targets = [
        *methods(job_pb2.DESCRIPTOR.services_by_name["JobService"]),
        *methods(rack_pb2.DESCRIPTOR.services_by_name["RackService"]),
    ]
    ch = channel(served.server.address, tls=served.tls)
    answers = set()
    for method in targets:
        empty = request_class(method)().SerializeToString()
        for metadata in ([], [("authorization", "Bearer not-a-token")], [("authorization", "x")]):
            code, details = call(ch, method, empty, metadata=metadata)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method.name, code, details)
            answers.add(details)
    assert len(answers) == 1, answers
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(ch)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    code, _ = code_of(stub.ServerReflectionInfo(iter([request]), timeout=5))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    health = _health(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_tenant_sees_watches_and_cancels_only_its_own_jobs(served: Served) -> None:
    served.gateway.gate.clear()  # jobs stay RUNNING until the test lets them go
    alice, bob, ops = served.stub("alice"), served.stub("bob"), served.stub("ops")
    job = alice.SubmitJob(kernel(sockets=2), timeout=5).job
    assert job.tenant == "alice"
    mine = bob.SubmitJob(kernel(sockets=2), timeout=5).job
    assert served.orchestrator.schedule_once() == 2

    refused = []
    for job_id in (job.id, "0123456789ab"):  # alice's job, and an id no job has
        for attempt in (
            lambda i=job_id: bob.GetJob(job_pb2.GetJobRequest(job_id=i), timeout=5),
            lambda i=job_id: bob.CancelJob(job_pb2.CancelJobRequest(job_id=i), timeout=5),
            bob.WatchJob(job_pb2.WatchJobRequest(job_id=job_id), timeout=5),
        ):
            code, details = code_of(attempt)
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "alice" not in details and "RUNNING" not in details and "PENDING" not in details
            refused.append(details.replace(job_id, "ID"))
    # Another tenant's job and no job at all get the very same answer.
    assert len(set(refused)) == 1, set(refused)

    listed = {j.id for j in bob.ListJobs(job_pb2.ListJobsRequest(), timeout=5).jobs}
    assert listed == {mine.id}
    assert {j.id for j in ops.ListJobs(job_pb2.ListJobsRequest(), timeout=5).jobs} == {
        job.id,
        mine.id,
    }
    assert ops.GetJob(job_pb2.GetJobRequest(job_id=job.id), timeout=5).job.tenant == "alice"
    # The rack view names bob's own job, and hides alice's behind a placeholder.
    rack = rack_pb2_grpc.RackServiceStub(
        channel(served.server.address, tls=served.tls, token=TOKENS["bob"])
    )
    held = {
        s.current_job_id
        for n in rack.GetRack(rack_pb2.GetRackRequest(), timeout=5).rack.nodes
        for s in n.sockets
    }
    assert job.id not in held and {mine.id, OTHER_TENANT} <= held
    # The refused cancel changed nothing; the owner's own cancel works.
    assert served.orchestrator.get(job.id).state is not JobState.CANCELLED
    cancelled = alice.CancelJob(job_pb2.CancelJobRequest(job_id=job.id), timeout=5).job
    assert cancelled.state == common_pb2.JOB_STATE_CANCELLED
    served.gateway.gate.set()


def test_request_ids_are_per_tenant(served: Served) -> None:
    """The same idempotency key from two tenants makes two jobs: one tenant's key never
    finds (or names) another's job."""
    a = served.stub("alice").SubmitJob(kernel(sockets=2, request_id="r1"), timeout=5)
    b = served.stub("bob").SubmitJob(kernel(sockets=4, request_id="r1"), timeout=5)
    again = served.stub("alice").SubmitJob(kernel(sockets=2, request_id="r1"), timeout=5)
    assert not a.deduplicated and not b.deduplicated and again.deduplicated
    assert a.job.id != b.job.id and again.job.id == a.job.id


# ------------------------------------------------------------------ quotas


def test_a_job_wider_than_the_quota_is_refused_with_the_numbers(served: Served) -> None:
    code, details = code_of(lambda: served.stub("bob").SubmitJob(kernel(sockets=8), timeout=5))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "'bob'" in details and "8 sockets" in details and "quota of 4" in details
    assert served.orchestrator.jobs() == []  # nothing stored


def test_a_tenant_never_holds_more_sockets_than_its_quota(served: Served) -> None:
    """Alice's quota is 8: of two 8-socket jobs one runs while the other waits, though
    the rack has 16 free sockets; bob's job uses the other node meanwhile."""
    served.gateway.gate.clear()
    alice = served.stub("alice")
    first = alice.SubmitJob(kernel(sockets=8), timeout=5).job
    second = alice.SubmitJob(kernel(sockets=8), timeout=5).job
    other = served.stub("bob").SubmitJob(kernel(sockets=4), timeout=5).job
    o = served.orchestrator
    assert o.schedule_once() == 2  # alice's first job and bob's
    until(lambda: len(o.jobs([JobState.RUNNING])) == 2, "alice's first job and bob's running")
    assert o.schedule_once() == 0  # a further round: the second must still wait
    running = {j.id for j in o.jobs([JobState.SCHEDULED, JobState.RUNNING])}
    assert running == {first.id, other.id}
    assert o.get(second.id).state is JobState.PENDING
    served.gateway.gate.set()
    assert wait_for(o, first.id) is JobState.SUCCEEDED
    assert o.schedule_once() == 1  # within her quota again
    assert wait_for(o, second.id) is JobState.SUCCEEDED


# ------------------------------------------------------------------ TLS and health


def test_a_plaintext_client_against_the_tls_server_fails(served: Served) -> None:
    with grpc.insecure_channel(served.server.address) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)
        code, _ = code_of(lambda: stub.ListJobs(job_pb2.ListJobsRequest(), timeout=3))
    assert code == grpc.StatusCode.UNAVAILABLE
    # With the CA and a token the same call works.
    assert served.stub("alice").ListJobs(job_pb2.ListJobsRequest(), timeout=5).jobs == []


def test_a_client_trusting_another_ca_refuses_the_server(
    served: Served, rack_certs: RackCerts
) -> None:
    other = TlsConfig(ca_file=rack_certs.foreign.ca_file)
    stub = job_pb2_grpc.JobServiceStub(channel(served.server.address, tls=other, token="x"))
    code, _ = code_of(lambda: stub.ListJobs(job_pb2.ListJobsRequest(), timeout=3))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_the_health_port_is_plaintext_and_serves_health_only(served: Served) -> None:
    address = served.server.health_address
    assert address is not None and address != served.server.address
    with grpc.insecure_channel(address) as ch:
        reply = _health(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        service = health_pb2.HealthCheckRequest(service=JOB_SERVICE)
        assert _health(ch).Check(service, timeout=5).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        for method in methods(job_pb2.DESCRIPTOR.services_by_name["JobService"]):
            code, _ = call(ch, method, b"", metadata=[("authorization", "Bearer x")])
            assert code == grpc.StatusCode.UNIMPLEMENTED, method.name
        rack = rack_pb2_grpc.RackServiceStub(ch)
        code, _ = code_of(lambda: rack.GetRack(rack_pb2.GetRackRequest(), timeout=5))
        assert code == grpc.StatusCode.UNIMPLEMENTED


# ------------------------------------------------------------------ mutual TLS in the rack


@pytest.fixture
def rack_server(rack_certs: RackCerts) -> Iterator[Server]:
    """An in-rack server (as a node agent's): mutual TLS, members only."""
    server = Server([], tls=rack_certs.member, rack_peers=True)
    yield server
    server.stop(0)


def check_health(address: str, tls: TlsConfig | None) -> tuple[grpc.StatusCode, str]:
    ch = channel(address, tls=tls, rack=True) if tls else grpc.insecure_channel(address)
    stub = _health(ch)
    result = code_of(lambda: stub.Check(health_pb2.HealthCheckRequest(), timeout=3))
    ch.close()
    return result


def test_only_rack_members_reach_an_in_rack_server(
    rack_server: Server, rack_certs: RackCerts
) -> None:
    assert check_health(rack_server.address, rack_certs.member)[0] == grpc.StatusCode.OK
    # Plaintext, no client certificate, or one of another CA: the handshake fails.
    for tls in (None, rack_certs.client, rack_certs.foreign):
        assert check_health(rack_server.address, tls)[0] == grpc.StatusCode.UNAVAILABLE, tls
    # A certificate of the rack's own CA for something else: the handshake passes (it
    # chains to the CA), the identity check refuses it.
    code, details = check_health(rack_server.address, rack_certs.stranger)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "only members of rack 'rdurack-rack'" in details


# ------------------------------------------------------------------ the tokens file


def test_tokens_file_errors_name_the_file_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    cases = {
        "tenants: {a: {}}\ntokens: [{sha256: nothex, tenant: a}]\n": "tokens.0.sha256",
        f"tenants: {{a: {{}}}}\ntokens: [{{sha256: {'a' * 64}, tenant: b}}]\n": "not in 'tenants'",
        "tenants: {a: {socket_quota: 0}}\ntokens: []\n": "tenants.a.socket_quota",
        "tenants: [\n": "not YAML",
        "- 1\n": "(top level)",
    }
    for text, expected in cases.items():
        bad.write_text(text)
        with pytest.raises(Exception, match=re.escape(expected)) as e:
            load_tokens(bad)
        assert str(bad) in str(e.value)


class _Context:
    """The two things Authenticator asks of a grpc.ServicerContext."""

    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError("aborted")


def test_require_admin_admits_admins_only(tmp_path: Path) -> None:
    auth = Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml"))
    ops = _Context([("authorization", f"Bearer {TOKENS['ops']}")])
    assert auth.require_admin(ops).tenant == "ops"  # type: ignore[arg-type]
    for metadata, code in (
        ([("authorization", f"bearer {TOKENS['alice']}")], grpc.StatusCode.PERMISSION_DENIED),
        ([], grpc.StatusCode.UNAUTHENTICATED),
    ):
        ctx = _Context(metadata)
        with pytest.raises(RuntimeError):
            auth.require_admin(ctx)  # type: ignore[arg-type]
        assert ctx.aborted is not None and ctx.aborted[0] == code
    # Open (no tokens file): everyone is an admin of no tenant.
    assert Authenticator.open().require_admin(_Context([])) is OPEN  # type: ignore[arg-type]
    assert auth.quotas() == {"alice": 8, "bob": 4}


def test_a_server_says_how_it_is_protected(tmp_path: Path) -> None:
    open_ = Authenticator.open()
    tokens = Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml"))
    assert security_notice("127.0.0.1", False, open_) == (
        "plaintext, unauthenticated: anyone who reaches it may submit and cancel any job "
        "(loopback only, this machine)"
    )
    assert security_notice("10.0.0.5", True, tokens) == (
        "TLS, bearer tokens required (3 tenants) (reachable from the network)"
    )
    assert "travel in the clear" in security_notice("0.0.0.0", False, tokens)


def test_bad_tls_files_are_named(tmp_path: Path, rack_certs: RackCerts) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    member = rack_certs.member
    cert, key, stranger_key = member.cert_file, member.key_file, rack_certs.stranger.key_file
    assert cert is not None and key is not None and stranger_key is not None

    def tls(
        ca: Path | None, cert: Path | None = None, key: Path | None = None, **kw: str
    ) -> TlsConfig | None:
        return tls_from(ca, cert, key, **kw)

    def loaded(ca: Path, cert: Path | None = None, key: Path | None = None) -> None:
        found = tls(ca, cert, key)
        assert found is not None
        found.ca_pem()
        if found.cert_file is not None:
            found.key_pair()

    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: loaded(tmp_path / "none.crt"), "TLS CA file .*none.crt: No such file"),
        (lambda: loaded(junk), "junk.pem: not a PEM certificate"),
        (lambda: loaded(member.ca_file, junk, key), "junk.pem: not a PEM"),
        (lambda: loaded(member.ca_file, cert, stranger_key), "does not belong"),
        (lambda: tls(member.ca_file, cert), "--tls-cert and --tls-key go"),
        (lambda: tls(None, cert), "need --tls-ca"),
        (lambda: tls(member.ca_file, server_name="no spaces"), "TLS server_name"),
    ]
    for make, message in cases:
        with pytest.raises(InvalidRequest, match=message):
            make()
    assert tls_from(None) is None


def test_the_cli_names_a_bad_ca_file_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rdurack.cli.main", "status", "--tls-ca", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"rdu: TLS CA file {tmp_path / 'x'}: No such file or directory"
    ]


def test_rdu_up_takes_security_from_its_flags_not_the_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's RDURACK_TLS_CA or tokens file in the shell does not reach the servers
    `rdu up` starts (a CA without a certificate would make them fail to start)."""
    from rdurack.processes import local_rack

    monkeypatch.setenv("RDURACK_TLS_CA", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("RDURACK_TOKENS", str(tmp_path / "tokens.yaml"))
    monkeypatch.setenv("RDURACK_TOKEN", "a client's token")
    env = local_rack.child_env(tmp_path)
    assert "RDURACK_TLS_CA" not in env and "RDURACK_TOKENS" not in env
    # Nor a client's token: an agent that registers (rdu join) reads RDURACK_TOKEN.
    assert "RDURACK_TOKEN" not in env
