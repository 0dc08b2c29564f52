"""The training job's spec, per-rank memory, step cost and scaling prediction."""

from __future__ import annotations

import pytest

from rdurack.errors import OutOfMemory
from rdurack.orchestrator.jobs import JobSpec
from rdurack.rack.models import builtin_models, model
from rdurack.rack.presets import platform
from rdurack.wire import jobs as job_convert
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.scaling import check_fits, predict_scaling, step_cost

RACK = platform("sn40l-rack16")
MODELS = builtin_models()


def test_a_preset_rank_holds_weights_master_copy_gradients_state_and_activations() -> None:
    w = TrainingWorkload(model="llama3.2-1b", world_size=2, global_batch=2, optimizer="adam")
    m = model("llama3.2-1b")
    mem = step_cost(w, RACK, MODELS).memory
    assert mem.weights == m.params * (2 + 4) and mem.gradients == m.params * 2
    assert mem.optimizer == m.params * 8  # Adam: two FP32 moments
    # Korthikanti et al.: s*b*h*(34 + 5*a*s/h) per layer, batch 1 per rank.
    s, h, a = 1024, m.hidden, m.heads
    assert mem.activations == pytest.approx(m.layers * s * h * (34 + 5 * a * s / h), rel=1e-9)
    check_fits(w, RACK, step_cost(w, RACK, MODELS))  # ~40 GB of 64: fits


def test_a_rank_that_does_not_fit_names_its_memory() -> None:
    w = TrainingWorkload(model="llama2-7b", world_size=1, global_batch=1)
    with pytest.raises(OutOfMemory, match=r"weights .* GB, gradients .* GB") as e:
        check_fits(w, RACK, step_cost(w, RACK, MODELS))
    assert e.value.asked_bytes > RACK.socket.hbm.capacity_bytes


def test_scaling_keeps_compute_and_grows_the_all_reduce_across_nodes() -> None:
    w = TrainingWorkload(model="llama3.2-1b", world_size=1, global_batch=4)
    points = predict_scaling(w, RACK, MODELS)
    assert [p.world_size for p in points] == [1, 2, 4, 8, 16]
    assert len({p.compute_s for p in points}) == 1 and points[0].all_reduce_s == 0
    assert [p.crosses_nodes for p in points] == [False] * 4 + [True]
    rates = [p.samples_per_s for p in points]
    assert rates == sorted(rates)  # more ranks, more samples/s ...
    assert points[-1].exposed_s > points[-2].exposed_s  # ... and slower links at 16
    for p in points:
        assert p.step_s == pytest.approx(p.compute_s + p.exposed_s)


def test_a_training_spec_round_trips_through_the_proto() -> None:
    w = TrainingWorkload(
        world_size=8,
        global_batch=64,
        epochs=3,
        momentum=0.0,
        broadcast_parameters=False,
        sampler="none",
        loop=b"\x00\xffpickled",
        timeout_s=2.5,
    )
    spec = JobSpec(workload=w, payload_mode="functional")
    assert job_convert.spec_from_proto(job_convert.spec_to_proto(spec), "") == spec
