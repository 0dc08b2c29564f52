"""The control plane's gRPC API fed random and mutated requests: every answer is a proper
status, and the server keeps serving."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rdurack.api.job_service import JOB_SERVICE
from rdurack.v1 import job_pb2, rack_pb2
from tests.support.control import (
    IMPROPER,
    PENDING,
    SUCCEEDED,
    Control,
    drain,
    prefill,
    submit,
    wait_terminal,
)

pytestmark = pytest.mark.integration

# ------------------------------------------------------------------ fuzzing


@dataclass(frozen=True)
class Rpc:
    path: str
    streaming: bool
    response: type[Message]
    valid: Message


def _rpcs(job_id: str) -> list[Rpc]:
    job = "/rdurack.v1.JobService/"
    rack = "/rdurack.v1.RackService/"
    return [
        Rpc(
            job + "SubmitJob",
            False,
            job_pb2.SubmitJobResponse,
            job_pb2.SubmitJobRequest(spec=prefill(1, name="fuzz")),
        ),
        Rpc(job + "GetJob", False, job_pb2.GetJobResponse, job_pb2.GetJobRequest(job_id=job_id)),
        Rpc(
            job + "ListJobs",
            False,
            job_pb2.ListJobsResponse,
            job_pb2.ListJobsRequest(states=[SUCCEEDED, PENDING], page_size=3, page_token="3"),
        ),
        Rpc(
            job + "CancelJob",
            False,
            job_pb2.CancelJobResponse,
            job_pb2.CancelJobRequest(job_id=job_id, reason="fuzz"),
        ),
        Rpc(
            job + "WatchJob",
            True,
            job_pb2.JobEvent,
            job_pb2.WatchJobRequest(job_id=job_id, after_sequence=2),
        ),
        Rpc(rack + "GetRack", False, rack_pb2.GetRackResponse, rack_pb2.GetRackRequest()),
        Rpc(rack + "ListNodes", False, rack_pb2.ListNodesResponse, rack_pb2.ListNodesRequest()),
    ]


def fuzz_inputs(valid: bytes, rng: random.Random, randoms: int = 200) -> list[bytes]:
    """Random byte strings, every truncation of the valid message, and bit flips of it."""
    inputs = [
        rng.randbytes(rng.choice([rng.randint(0, 16), rng.randint(0, 300)])) for _ in range(randoms)
    ]
    inputs += [valid[:n] for n in range(len(valid))]
    for _ in range(60 if valid else 0):
        flipped = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(flipped))
            flipped[at] ^= 1 << rng.randrange(8)
        inputs.append(bytes(flipped))
    return inputs


def _answer(ch: grpc.Channel, rpc: Rpc, data: bytes) -> str | None:
    """None if the server answered properly; else what was wrong."""
    try:
        if rpc.streaming:
            call: grpc.UnaryStreamMultiCallable[bytes, bytes] = ch.unary_stream(
                rpc.path, request_serializer=None, response_deserializer=None
            )
            stream = call(data, timeout=3)
            try:
                for n, raw in enumerate(stream):
                    rpc.response.FromString(raw)  # a valid message, or DecodeError
                    if n >= 2:
                        break
            finally:
                stream.cancel()
        else:
            unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
                rpc.path, request_serializer=None, response_deserializer=None
            )
            rpc.response.FromString(unary(data, timeout=30))
    except grpc.RpcError as e:
        if e.code() in IMPROPER:
            return f"{e.code().name}: {e.details()}"
        return None
    except Exception as e:
        return f"bad response: {type(e).__name__}: {e}"
    return None


def test_fuzzed_requests_get_proper_statuses_and_the_server_keeps_serving(
    control: Control,
) -> None:
    stub = control.jobs
    known = submit(stub, prefill(1, name="fuzz-target")).id
    assert wait_terminal(stub, [known])[known].state == SUCCEEDED
    rng = random.Random(20240604)
    # path -> improper answer -> (how many inputs got it, the first such input)
    failures: dict[str, dict[str, tuple[int, bytes]]] = {}
    sent = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        for rpc in _rpcs(known):
            inputs = fuzz_inputs(rpc.valid.SerializeToString(), rng)
            sent += len(inputs)
            answers = pool.map(lambda d, r=rpc: (d, _answer(control.channel, r, d)), inputs)
            for data, problem in answers:
                if problem is not None:
                    seen = failures.setdefault(rpc.path, {})
                    count, example = seen.get(problem, (0, data))
                    seen[problem] = (count + 1, example)
    assert sent > 7 * 200

    # Still serving: health, a valid job end to end, and nothing left running.
    checker: Any = health_pb2_grpc.HealthStub(control.channel)
    reply = checker.Check(health_pb2.HealthCheckRequest(service=JOB_SERVICE), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    after = submit(stub, prefill(2, name="after-fuzz")).id
    assert wait_terminal(stub, [after])[after].state == SUCCEEDED
    drain(stub, timeout_s=60)  # jobs some mutated SubmitJob created have all finished
    assert stub.GetJob(job_pb2.GetJobRequest(job_id=known), timeout=30).job.state == SUCCEEDED

    summary = "\n".join(
        f"{path}: {count} x {problem} (e.g. input {example[:32].hex() or 'empty'})"
        for path, problems in failures.items()
        for problem, (count, example) in problems.items()
    )
    assert not failures, f"improper answers out of {sent} requests:\n{summary}"
