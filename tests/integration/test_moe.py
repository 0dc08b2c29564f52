"""Mixture-of-experts decode jobs on the real cluster (gRPC, node agents, Ray socket
actors) against the predictor: the sockets price each step with the same timing model
and placement, so the emulated times agree."""

from __future__ import annotations

import pytest

from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from tests.support.control import PLATFORM, SUCCEEDED, Control, kernel, submit, wait_terminal

pytestmark = pytest.mark.integration

TOKENS, CONTEXT = 20, 1024


@pytest.mark.parametrize(("name", "sockets"), [("deepseek-r1", 16), ("mixtral-8x7b", 8)])
def test_an_moe_decode_job_agrees_with_the_predictor(
    control: Control, name: str, sockets: int
) -> None:
    spec = kernel(model=name, sockets=sockets, tokens=TOKENS, sequence_length=CONTEXT)
    job = submit(control.jobs, spec)
    done = wait_terminal(control.jobs, [job.id], timeout_s=120)[job.id]
    assert done.state == SUCCEEDED, done.error_message
    step = Predictor(platform(PLATFORM)).step(
        model(name), Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, CONTEXT, sockets
    )
    assert done.result.kernel.emulated_s == pytest.approx(TOKENS * step.total_s, rel=0.03)
    assert done.result.kernel.tokens_per_s == pytest.approx(1 / step.total_s, rel=0.03)
