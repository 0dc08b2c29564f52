"""Mixture-of-experts decode jobs on the real cluster (gRPC, node agents, Ray socket
actors) against the predictor: the sockets price each step with the same timing model
and placement, so the emulated times agree, whichever way the experts are mapped."""

from __future__ import annotations

import grpc
import pytest

from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ExpertMapping, model
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2
from rdurack.workloads.predictor import Predictor
from tests.support.control import (
    PLATFORM,
    SUCCEEDED,
    Control,
    kernel,
    submit,
    wait_terminal,
)

pytestmark = pytest.mark.integration

TOKENS, CONTEXT = 20, 1024
CASES = [
    ("deepseek-r1", 16, None),
    ("deepseek-r1", 16, ExpertMapping.TENSOR_PARALLEL),
    ("mixtral-8x7b", 8, None),
]


@pytest.mark.parametrize(("name", "sockets", "mapping"), CASES)
def test_an_moe_decode_job_agrees_with_the_predictor(
    control: Control, name: str, sockets: int, mapping: ExpertMapping | None
) -> None:
    spec = kernel(model=name, sockets=sockets, tokens=TOKENS, sequence_length=CONTEXT)
    if mapping is not None:
        spec.kernel.expert_mapping = common_pb2.EXPERT_MAPPING_TENSOR_PARALLEL
    job = submit(control.jobs, spec)
    done = wait_terminal(control.jobs, [job.id], timeout_s=120)[job.id]
    assert done.state == SUCCEEDED, done.error_message
    step = Predictor(platform(PLATFORM)).step(
        model(name).placed(mapping), Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, CONTEXT, sockets
    )
    assert done.result.kernel.emulated_s == pytest.approx(TOKENS * step.total_s, rel=0.03)
    assert done.result.kernel.tokens_per_s == pytest.approx(1 / step.total_s, rel=0.03)


def test_placing_the_experts_of_a_dense_model_is_refused_at_submission(
    control: Control,
) -> None:
    spec = kernel(model="llama3.1-8b", sockets=8)
    spec.kernel.expert_mapping = common_pb2.EXPERT_MAPPING_EXPERT_PARALLEL
    with pytest.raises(grpc.RpcError) as err:
        submit(control.jobs, spec)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.kernel.expert_mapping: llama3.1-8b has no experts" in (err.value.details() or "")
