"""Serve jobs on the real cluster (gRPC, node agents, Ray socket actors) against `rdu
predict serve`: a few cases of the grid tests/unit/test_serve_cluster.py runs in full,
through the JobService and through the `rdu` command line as a user runs it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rdurack.cli.views import serve_fields
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2, job_pb2, serve_pb2
from rdurack.wire.jobs import job_to_proto
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeRequest
from rdurack.workloads.serving.predict import predict_serve
from rdurack.workloads.serving.speculative import SpeculativeSetting
from tests.support.cli import rdu, rdu_json
from tests.support.control import PLATFORM, SUCCEEDED, Control, submit, wait_terminal
from tests.support.serving import assert_agree

pytestmark = pytest.mark.integration

CASES = [
    # model, sockets, batch, prompt = output tokens, speculative
    ("llama3.1-8b", 8, 16, 512, False),
    ("llama2-7b", 16, 1, 128, False),  # a TP group over both nodes
    ("llama3.1-70b", 16, 1, 2048, True),
]


def _spec(model: str, sockets: int, batch: int, tokens: int, speculative: bool) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        platform=PLATFORM,
        payload_mode=common_pb2.PAYLOAD_MODE_TIMING,
        kernel=job_pb2.KernelJob(
            model=model,
            phase=common_pb2.PHASE_SERVE,
            sequence_length=tokens,
            output_tokens=tokens,
            batch_size=batch,
            num_sockets=sockets,
            speculative=serve_pb2.SpeculativeDecoding() if speculative else None,
        ),
    )


def _predicted(model: str, sockets: int, batch: int, tokens: int, speculative: bool) -> Any:
    setting = SpeculativeSetting() if speculative else None
    request = ServeRequest(model, batch, tokens, tokens, sockets, speculative=setting)
    report = predict_serve(Predictor(platform(PLATFORM)), request, builtin_models())
    return report.model_dump(mode="json")


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}s-b{c[2]}-{c[3]}" for c in CASES])
def test_a_serve_job_agrees_with_predict_serve(
    control: Control, case: tuple[str, int, int, int, bool]
) -> None:
    job = submit(control.jobs, _spec(*case))
    done = wait_terminal(control.jobs, [job.id], timeout_s=120)[job.id]
    assert done.state == SUCCEEDED, done.error_message
    result = done.result.kernel
    assert result.HasField("serve")
    assert_agree(serve_fields(done), _predicted(*case))
    assert job_to_proto(control.orchestrator.get(job.id)).result.kernel.serve == result.serve
    assert result.emulated_s == pytest.approx(result.serve.e2e_s, rel=1e-9)
    assert (done.emulated_end_ns - done.emulated_start_ns) * 1e-9 == pytest.approx(
        result.serve.e2e_s, abs=1e-8
    )


def test_rdu_submit_kernel_phase_serve_prints_the_fields_of_predict_serve(
    control: Control,
) -> None:
    sizes = ["--model", "llama3.1-8b", "--sockets", "8", "--batch-size", "4"]
    sizes += ["--prompt-tokens", "256", "--output-tokens", "256", "--speculative"]
    address = ["--address", control.server.address]
    done = rdu("submit", "kernel", "--phase", "serve", *sizes, "--wait", "--json", *address)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    predicted = rdu_json("predict", "serve", "--platform", PLATFORM, *sizes)
    assert job["state"] == "SUCCEEDED" and job["phase"] == "serve"
    assert set(predicted) <= set(job)
    assert_agree(job, predicted)
    assert job["speculative"]["draft_model"] == "llama3.2-1b"
    # A step's option on a serve job is refused in one line, before anything is sent.
    wrong = rdu(
        "submit", "kernel", "--phase", "serve", "--model", "llama2-7b", "--seq", "8", *address
    )
    assert wrong.returncode == 2 and len(wrong.stderr.splitlines()) == 1
    assert "--prompt-tokens" in wrong.stderr
