"""Hostile input, property-based: every RPC of JobService, RackService, LinkService and
health, and the CLI's job files (`--trace` JSONL, `--spec` what-if YAML).

The servers must keep serving and answer every request with a proper status code
(never UNKNOWN or INTERNAL, which mean a crash); the CLI must exit 0, or 2 with one line
on stderr and no traceback. NodeAgentService is fuzzed in
tests/integration/test_fuzz_node_agent.py (it needs Ray). Bounded: a fixed number of
examples per property, no deadline (a loaded machine is slow, not wrong).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf.descriptor import MethodDescriptor
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rdurack.api.job_service import JOB_MAX_REQUEST_BYTES, serve_api
from rdurack.api.server import Server
from rdurack.cli import main as cli
from rdurack.node_agent.links.endpoint import LinkEndpoint
from rdurack.node_agent.links.wire import MAX_MESSAGE_BYTES
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.security.auth import Authenticator
from rdurack.v1 import common_pb2, job_pb2, link_pb2, rack_pb2
from tests.support.fake_rack import RACK, FakeGateway
from tests.support.fuzz_messages import hostile
from tests.support.grpc_calls import PROPER, call
from tests.support.tokens import TOKENS, write_tokens

EXAMPLES = 40
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
JOB = job_pb2.DESCRIPTOR.services_by_name["JobService"]
RACK_SERVICE = rack_pb2.DESCRIPTOR.services_by_name["RackService"]
LINK = link_pb2.DESCRIPTOR.services_by_name["LinkService"]
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
ALL_INPUTS = [
    m.input_type for s in (JOB, RACK_SERVICE, LINK, HEALTH) for m in s.methods
]  # for type confusion
TOKEN = [("authorization", f"Bearer {TOKENS['alice']}")]


@dataclass
class Api:
    server: Server
    channel: grpc.Channel
    orchestrator: Orchestrator


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """The orchestrator's API as orchestrator_main serves it (tokens on), over the
    in-memory gateway."""
    tmp = tmp_path_factory.mktemp("fuzz-api")
    auth = Authenticator.from_file(write_tokens(tmp / "tokens.yaml"))
    o = Orchestrator(
        JobStore(tmp / "jobs.sqlite"), FakeGateway(), RACK, poll_s=0.05, quotas=auth.quotas()
    )
    o.start()
    server = serve_api(o, auth)
    ch = grpc.insecure_channel(server.address)
    yield Api(server, ch, o)
    ch.close()
    server.stop(0)
    o.stop()
    o.store.close()


@pytest.fixture(scope="module")
def link() -> Iterator[tuple[LinkEndpoint, grpc.Channel]]:
    endpoint = LinkEndpoint("rdu-n0-s0")
    ch = grpc.insecure_channel(
        endpoint.address,
        options=[("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)],
    )
    yield endpoint, ch
    ch.close()
    endpoint.close()


def still_serves(api: Api) -> None:
    """A good request succeeds after the hostile ones."""
    good = job_pb2.SubmitJobRequest(
        spec=job_pb2.JobSpec(
            kernel=job_pb2.KernelJob(
                model="llama2-7b", phase=common_pb2.PHASE_PREFILL, sequence_length=64, num_sockets=1
            )
        )
    )
    method = JOB.methods_by_name["SubmitJob"]
    assert call(api.channel, method, good.SerializeToString(), metadata=TOKEN)[0] == (
        grpc.StatusCode.OK
    )


def _proper(method: MethodDescriptor, answer: tuple[grpc.StatusCode, str]) -> None:
    code, details = answer
    assert code in PROPER, f"{method.full_name}: {code.name}: {details}"
    assert "Traceback" not in details


# ------------------------------------------------------------------ the orchestrator's API


@pytest.mark.parametrize("method", [*JOB.methods, *RACK_SERVICE.methods], ids=lambda m: m.name)
@FUZZ
@given(data=st.data())
def test_every_api_method_answers_hostile_requests_properly(
    api: Api, method: MethodDescriptor, data: st.DataObject
) -> None:
    payload = data.draw(hostile(method, ALL_INPUTS), label="request")
    metadata = data.draw(st.sampled_from([TOKEN, TOKEN, []]), label="metadata")
    _proper(method, call(api.channel, method, payload, metadata=metadata, timeout_s=10))


def test_the_api_still_serves_after_the_fuzzing(api: Api) -> None:
    still_serves(api)


# Kernel specs near the valid ones, so that many are accepted, stored and scheduled.
near_valid = st.builds(
    lambda model, phase, seq, batch, sockets, tokens, priority, rid: job_pb2.SubmitJobRequest(
        spec=job_pb2.JobSpec(
            priority=priority,
            client_request_id=rid,
            kernel=job_pb2.KernelJob(
                model=model,
                phase=phase,
                sequence_length=seq,
                batch_size=batch,
                num_sockets=sockets,
                output_tokens=tokens,
            ),
        )
    ),
    # Mostly valid values, sometimes not: an unknown model or phase, sizes out of range.
    st.sampled_from(["llama2-7b", "llama2-7b", "mistral-7b", "llama3.1-405b", "nope"]),
    st.sampled_from([1, 2, 3, 1, 2, 3, 0, 4]),
    st.one_of(st.integers(1, 4096), st.integers(1, 4096), st.integers(0, 1 << 21)),
    st.one_of(st.integers(1, 8), st.integers(1, 8), st.integers(0, 5000)),
    st.one_of(st.sampled_from([1, 2, 4, 8, 8, 16]), st.integers(0, 20)),
    st.integers(0, 50),
    st.one_of(st.integers(-1000, 1000), st.integers(-2000, 2000)),
    st.sampled_from(["", "r1", "r2"]),
)


@FUZZ
@given(request=near_valid)
def test_near_valid_submissions_are_accepted_or_refused_properly(
    api: Api, request: job_pb2.SubmitJobRequest
) -> None:
    method = JOB.methods_by_name["SubmitJob"]
    answer = call(api.channel, method, request.SerializeToString(), metadata=TOKEN)
    event(answer[0].name)  # --hypothesis-show-statistics: how many were accepted
    _proper(method, answer)


@FUZZ
@given(token=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=600))
def test_any_other_token_is_unauthenticated(api: Api, token: str) -> None:
    method = JOB.methods_by_name["ListJobs"]
    code, _ = call(api.channel, method, b"", metadata=[("authorization", f"Bearer {token}")])
    expected = grpc.StatusCode.OK if token.strip() == TOKENS["alice"] else None
    assert code == (expected or grpc.StatusCode.UNAUTHENTICATED)


def test_an_oversized_request_is_refused_before_decoding(api: Api) -> None:
    method = JOB.methods_by_name["SubmitJob"]
    code, _ = call(api.channel, method, b"\x0a" * (JOB_MAX_REQUEST_BYTES + 1), metadata=TOKEN)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    still_serves(api)


@pytest.mark.parametrize("method", list(HEALTH.methods), ids=lambda m: m.name)
@settings(FUZZ, max_examples=8)  # Watch streams until its deadline: few examples
@given(data=st.data())
def test_health_answers_hostile_requests_properly(
    api: Api, method: MethodDescriptor, data: st.DataObject
) -> None:
    payload = data.draw(hostile(method, ALL_INPUTS), label="request")
    _proper(method, call(api.channel, method, payload, timeout_s=0.3))


# ------------------------------------------------------------------ links


@pytest.mark.parametrize("method", list(LINK.methods), ids=lambda m: m.name)
@FUZZ
@given(data=st.data())
def test_every_link_method_answers_hostile_requests_properly(
    link: tuple[LinkEndpoint, grpc.Channel], method: MethodDescriptor, data: st.DataObject
) -> None:
    _, ch = link
    if method.client_streaming:
        payload: bytes | list[bytes] = data.draw(
            st.lists(hostile(method, ALL_INPUTS), min_size=0, max_size=4), label="stream"
        )
    else:
        payload = data.draw(hostile(method, ALL_INPUTS), label="request")
    _proper(method, call(ch, method, payload, timeout_s=10))


def test_the_link_still_serves_and_refuses_oversized_messages(
    link: tuple[LinkEndpoint, grpc.Channel],
) -> None:
    endpoint, ch = link
    deliver = LINK.methods_by_name["Deliver"]
    code, _ = call(ch, deliver, b"\x12" * (MAX_MESSAGE_BYTES + 1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    peer = LinkEndpoint("rdu-n0-s1")
    try:
        peer.connect({endpoint.socket_id: endpoint.address})
        assert peer.send(endpoint.socket_id, "ok", 0, 0, 5, 4, b"abcd") == 4
        assert endpoint.receive("ok", 0, "rdu-n0-s1", timeout_s=5).payload(5.0) == b"abcd"
    finally:
        peer.close()


# ------------------------------------------------------------------ the CLI's job files


def rdu(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """Run the `rdu` entry point in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["rdu", *argv])
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def _one_line_error(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    if code != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rdu: "), err


scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
SPEC_KEYS = [
    "base", "nodes", "node", "socket", "sockets", "hbm", "ddr", "sram", "capacity_bytes",
    "bandwidth_bytes_per_s", "latency_ns", "name", "links", "x",
]  # fmt: skip
yaml_values = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(st.sampled_from(SPEC_KEYS), st.text(max_size=6)), inner, max_size=4
        ),
    ),
    max_leaves=12,
)
spec_files = st.one_of(
    yaml_values.map(lambda v: yaml.safe_dump(v).encode()),
    st.text(max_size=200).map(str.encode),
    st.binary(max_size=200),
)


@settings(FUZZ, max_examples=60)
@given(content=spec_files)
def test_any_what_if_file_is_accepted_or_refused_in_one_line(
    content: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("spec") / "whatif.yaml"
    path.write_bytes(content)
    with pytest.MonkeyPatch.context() as mp:
        code, _, err = rdu(["spec", "--platform", "sn40l-node", "--spec", str(path), "--json"], mp)
    assert code in (0, 2), err
    _one_line_error(code, err)


trace_line = st.one_of(
    st.dictionaries(
        st.sampled_from(["arrival_s", "prompt", "prompt_tokens", "expert", "output_tokens", "x"]),
        scalar,
        max_size=5,
    ).map(json.dumps),
    st.text(max_size=40),
)
trace_files = st.one_of(
    st.lists(trace_line, max_size=6).map(lambda lines: "\n".join(lines).encode()),
    st.binary(max_size=200),
)


@settings(FUZZ, max_examples=60)
@given(content=trace_files)
def test_any_trace_file_is_accepted_or_refused_in_one_line(
    content: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A trace that reads is submitted: to a port where nothing listens, so exit 1 (the
    orchestrator is unavailable); one that does not is exit 2 before anything is sent."""
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    path.write_bytes(content)
    argv = ["submit", "coe", "--trace", str(path), "--address", "127.0.0.1:1"]
    with pytest.MonkeyPatch.context() as mp:
        code, _, err = rdu(argv, mp)
    assert code in (1, 2), err
    _one_line_error(code, err)
    if code == 1:
        assert "unavailable" in err


def test_a_missing_job_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (
        ["spec", "--platform", "sn40l-node", "--spec", str(tmp_path / "none.yaml")],
        ["submit", "coe", "--trace", str(tmp_path / "none.jsonl"), "--address", "127.0.0.1:1"],
        ["submit", "coe", "--trace", str(tmp_path), "--address", "127.0.0.1:1"],  # a directory
    ):
        code, _, err = rdu(argv, monkeypatch)
        assert code == 2, err
        _one_line_error(code, err)
