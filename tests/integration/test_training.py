"""DDP training on the emulated rack: ranks in the socket actors, gradients over the
gRPC links, jobs through the orchestrator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from rdurack.api.job_service import JOB_SERVICE, JobService
from rdurack.api.node_gateway import GrpcNodeGateway
from rdurack.api.rack_service import SERVICE as RACK_SERVICE
from rdurack.api.rack_service import RackService
from rdurack.api.server import Server, channel
from rdurack.cli.views import job_dict
from rdurack.client.training import run_training_loop
from rdurack.node_agent.training.script import TrainContext
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.rack.spec import Tier
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc
from rdurack.wire import training as training_convert
from rdurack.workloads.training.checkpoint import latest, load
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.loop import train_threaded
from rdurack.workloads.training.profl import largest_shrunken
from rdurack.workloads.training.scaling import built_in_plan, predict_scaling
from tests.support.agents import ServedAgent, start_agents, stop_agents
from tests.support.control import FAILED, SUCCEEDED, Control, submit, wait_terminal

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trainer(control: Control, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    """The control plane's orchestrator, checkpointing training jobs to a temp dir."""
    control.orchestrator.checkpoint_dir = tmp_path_factory.mktemp("checkpoints")
    yield control
    control.orchestrator.checkpoint_dir = None


def train_spec(functional: bool = True, **fields: object) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="train-test",
        training=job_pb2.TrainingJob(**fields),  # type: ignore[arg-type]
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL
        if functional
        else common_pb2.PAYLOAD_MODE_TIMING,
    )


def run(control: Control, spec: job_pb2.JobSpec, timeout_s: float = 240) -> job_pb2.Job:
    job = submit(control.jobs, spec)
    return wait_terminal(control.jobs, [job.id], timeout_s=timeout_s)[job.id]


@pytest.mark.parametrize("world", [2, 4, 16])
def test_ddp_equals_single_process_training_on_the_global_batch(
    trainer: Control, world: int
) -> None:
    steps, batch = 6, 32
    job = run(
        trainer,
        train_spec(world_size=world, global_batch=batch, steps=steps, checkpoint_every=steps),
    )
    assert job.state == SUCCEEDED, job.error_message
    assert len({s.node_index for s in job.sockets}) == (2 if world > 8 else 1)
    ckpt_dir = trainer.orchestrator.checkpoint_dir
    assert ckpt_dir is not None
    path = latest(ckpt_dir / job.id)
    assert path is not None
    rank0 = job.sockets[0].id
    state = load(path, device=rank0, map_location=rank0)
    assert state.step == steps
    one = TrainingWorkload(world_size=1, global_batch=batch, steps=steps)
    (reference,) = train_threaded(one.train_spec(resume=False))
    for name, value in reference.params.items():
        np.testing.assert_allclose(state.params[name], value, atol=1e-5, err_msg=name)
    r = job.result.training
    assert r.steps_completed == steps and len(r.losses) == steps and r.world_size == world
    assert r.step_time_s > 0 and r.samples_per_s > 0 and not r.diagnostics
    assert r.peak_hbm_bytes >= r.memory.total > 0


# The job's own deadline (600 s) governs, not pytest's 300 s: with two test suites on
# the 2 cores at once it took over 300 s.
@pytest.mark.timeout(900)
def test_16_ranks_learn_digits_to_95_percent(trainer: Control) -> None:
    job = run(
        trainer,
        # 10 epochs (100 steps): 96.9% in one process on the same batches; 20 took the
        # suite another minute for 98.2%.
        train_spec(world_size=16, global_batch=128, epochs=10, learning_rate=0.3),
        timeout_s=600,
    )
    assert job.state == SUCCEEDED, job.error_message
    r = job.result.training
    assert r.test_accuracy >= 0.95, r.test_accuracy
    assert r.losses[-1] < r.losses[0]
    view = job_dict(job)  # what `rdu submit train --json` prints
    for key in ("test_accuracy", "final_loss", "step_time_s", "samples_per_s", "peak_hbm_bytes"):
        assert view[key] is not None, key
    assert view["diagnostics"] == []


def test_the_articles_mistakes_are_diagnosed(trainer: Control) -> None:
    no_broadcast = run(
        trainer, train_spec(world_size=4, global_batch=32, steps=4, broadcast_parameters=False)
    )
    no_sampler = run(trainer, train_spec(world_size=4, global_batch=32, steps=4, sampler="none"))
    for job, code in ((no_broadcast, "replicas-differ"), (no_sampler, "duplicate-samples")):
        assert job.state == SUCCEEDED, job.error_message
        codes = [d.code for d in job.result.training.diagnostics]
        assert code in codes, codes
    (d,) = [d for d in no_broadcast.result.training.diagnostics if d.code == "replicas-differ"]
    assert "broadcast from rank 0" in d.message


def test_a_straggler_sets_the_step_time_and_a_short_timeout_names_it(
    trainer: Control, rack: list[ServedAgent]
) -> None:
    def timed(**fields: object) -> job_pb2.Job:
        spec = train_spec(
            False, model="llama3.2-1b", world_size=4, global_batch=4, steps=3, **fields
        )
        return run(trainer, spec)

    healthy = timed()
    assert healthy.state == SUCCEEDED, healthy.error_message
    slow = healthy.sockets[2].id  # one rank of the next job, slowed 3x
    agent = rack[healthy.sockets[2].node_index].agent
    agent.slow_socket(slow, 3.0)
    try:
        straggling = timed()
        assert straggling.state == SUCCEEDED, straggling.error_message
        assert [s.id for s in straggling.sockets] == [s.id for s in healthy.sockets]
        fast, lagging = healthy.result.training, straggling.result.training
        # Every rank waits for the slowest at the gradient all-reduce: a step takes the
        # straggler's compute (3x) plus the all-reduce tail after its backward, which
        # is no longer than the tail of a healthy step (more of it now hides).
        slowest_s = 3 * fast.compute_s
        assert slowest_s < lagging.step_time_s <= slowest_s + fast.exposed_allreduce_s
        assert lagging.step_time_s > 1.5 * fast.step_time_s
        lag_s = 2 * fast.compute_s  # its forward and backward end 2x their time later
        failed = timed(timeout_s=lag_s / 2)
        assert failed.state == FAILED
        assert f"rank 2 ({slow})" in failed.error_message and "timeout" in failed.error_message
    finally:
        agent.slow_socket(slow, 1.0)


def test_a_clients_own_loop_runs_once_per_rank(trainer: Control) -> None:
    def loop(ctx: TrainContext) -> list[float]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("rdu")  # torch's own, over the rack's links
        x = torch.full((3,), ctx.rank + 1.0)
        dist.all_reduce(x)
        dist.barrier()
        return [float(v) for v in x]

    address = trainer.server.address
    results = run_training_loop(loop, world_size=3, address=address)
    assert results == [[6.0, 6.0, 6.0]] * 3  # 1 + 2 + 3 on every rank

    def wrong(ctx: TrainContext) -> None:
        import torch.distributed as dist

        dist.init_process_group("rdu", world_size=1, rank=0)

    with pytest.raises(Exception, match=r"\[wrong-world-size\] init_process_group\(world_size=1\)"):
        run_training_loop(wrong, world_size=2, address=address)


def test_timing_mode_agrees_with_the_ddp_scaling_prediction(trainer: Control) -> None:
    w = TrainingWorkload(model="llama3.2-1b", world_size=16, global_batch=16, steps=3)
    (predicted,) = predict_scaling(w, platform("sn40l-rack16"), builtin_models(), (16,))
    job = run(trainer, train_spec(False, model="llama3.2-1b", world_size=16, global_batch=16,
                                  steps=3))  # fmt: skip
    assert job.state == SUCCEEDED, job.error_message
    r = job.result.training
    assert r.compute_s == pytest.approx(predicted.compute_s, rel=1e-6)
    assert r.allreduce_s == pytest.approx(predicted.all_reduce_s, rel=0.03)
    # Rank 0, the root of DDP's initial broadcast, runs ahead of the others and waits
    # for them at the first all-reduce, which the prediction leaves out: 15% on 3 steps.
    assert r.step_time_s == pytest.approx(predicted.step_s, rel=0.15)


# ------------------------------------------------------------------ progressive training (ProFL)

# The default configuration of docs/training.md: a 4-block MLP on digits, DDP over 4
# sockets. Full training: 30 epochs; progressive: at most 5 epochs a stage.
PROFL = TrainingWorkload(world_size=4, global_batch=64, blocks=4, hidden=64, epochs=30)
HBM_CAP = 128_000  # bytes of HBM per socket: under full training's peak, over progressive's


def job_of(w: TrainingWorkload) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="profl-test",
        training=training_convert.workload_to_proto(w),
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
    )


def test_progressive_training_runs_under_a_cap_full_training_cannot_meet(
    trainer: Control,
) -> None:
    rack = platform("sn40l-rack16")
    capped = PROFL.model_copy(update={"hbm_cap_bytes": HBM_CAP})
    with pytest.raises(grpc.RpcError) as refused:
        submit(trainer.jobs, job_of(capped))
    err = refused.value
    details = err.details() or ""
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    asked = built_in_plan(PROFL, rack).peak(Tier.HBM)
    assert f"HBM cannot hold {asked:,} bytes" in details
    assert f"{HBM_CAP:,} bytes free" in details and "hbm_cap_bytes" in details

    progressive = capped.model_copy(update={"strategy": "progressive", "epochs": 5})
    shrunk = largest_shrunken(capped, rack)  # trained fully: full training's 30 epochs
    assert shrunk.workload.epochs == 30 and shrunk.workload.strategy == "full"
    specs = {"full": PROFL, "progressive": progressive, "shrunken": shrunk.workload}
    ids = {name: submit(trainer.jobs, job_of(w)).id for name, w in specs.items()}  # 12 sockets
    done = wait_terminal(trainer.jobs, ids.values(), timeout_s=600)
    jobs = {name: done[i] for name, i in ids.items()}
    for name, job in jobs.items():
        assert job.state == SUCCEEDED, (name, job.error_message)
    full, prog, base = (jobs[n].result.training for n in ("full", "progressive", "shrunken"))

    # Memory: every socket's HBM peak as planned; progressive's at least 40% below.
    assert full.peak_hbm_bytes == asked
    assert [m.peak_hbm_bytes for m in full.socket_memory] == [asked] * 4
    assert prog.peak_hbm_bytes <= HBM_CAP < full.peak_hbm_bytes
    assert prog.peak_hbm_bytes <= 0.6 * full.peak_hbm_bytes, (prog.peak_hbm_bytes, asked)
    assert prog.peak_ddr_bytes > 0 == full.peak_ddr_bytes  # blocks not yet grown wait in DDR
    plan = built_in_plan(progressive, rack)
    assert [s.peak_hbm_bytes for s in prog.stages] == [p.peak_bytes["hbm"] for p in plan.stages]
    # Shrinking back to front, then growing front to back; the steps add up.
    assert [s.name for s in prog.stages] == [f"shrink block {i}" for i in (3, 2, 1, 0)] + [
        f"grow block {i}" for i in range(4)
    ]
    assert sum(s.steps for s in prog.stages) == prog.steps_completed <= 8 * 105
    assert all(s.HasField("test_accuracy") for s in prog.stages)
    assert [s.name for s in full.stages] == ["full"] and full.steps_completed == 30 * 21

    # Accuracy within 2 points of full training. Against the shrunken model the paper
    # reports a win; on digits the two are close, either way round by seed (on threads,
    # seeds 0-4: -1.1 to +2.9 points; docs/training.md), so only that is asserted.
    assert prog.test_accuracy >= full.test_accuracy - 0.02, (prog.test_accuracy, full.test_accuracy)
    assert base.peak_hbm_bytes == shrunk.peak_hbm_bytes <= HBM_CAP
    assert abs(prog.test_accuracy - base.test_accuracy) <= 0.03, base.test_accuracy
    view = job_dict(jobs["progressive"])  # what `rdu submit train --json` prints
    assert view["strategy"] == "progressive" and len(view["stages"]) == 8
    assert view["stages"][-1]["peak_hbm_bytes"] == prog.stages[-1].peak_hbm_bytes
    print(
        f"\nProFL default config: full {full.test_accuracy:.4f}, {asked:,} B HBM; "
        f"progressive {prog.test_accuracy:.4f}, {prog.peak_hbm_bytes:,} B "
        f"({1 - prog.peak_hbm_bytes / asked:.1%} less), {prog.steps_completed} steps; "
        f"shrunken ({shrunk.family}) {shrunk.workload.blocks}x{shrunk.workload.hidden} "
        f"{base.test_accuracy:.4f}, {base.peak_hbm_bytes:,} B"
    )


# ------------------------------------------------------------------ recovery, on a rack of its own


def test_a_killed_socket_restarts_the_job_from_its_checkpoint(
    ray_session: None, tmp_path: Path
) -> None:
    """One node of 8 sockets of its own (killing one would degrade the shared rack)."""
    served = start_agents(platform("sn40l-node"), link_timeout_s=5.0)
    gateway = GrpcNodeGateway([a.server.address for a in served])
    store = JobStore(tmp_path / "jobs.sqlite")
    orch = Orchestrator(store, gateway, platform("sn40l-node"), checkpoint_dir=tmp_path / "ck")
    orch.start()
    server = Server(
        [(JOB_SERVICE, JobService(orch).add_to), (RACK_SERVICE, RackService(orch).add_to)]
    )
    try:
        with channel(server.address) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            spec = train_spec(
                world_size=4, global_batch=32, steps=60, checkpoint_every=5, wall_timeout_s=5.0
            )
            job = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30).job
            deadline = time.monotonic() + 60
            while True:  # until it has written a checkpoint
                now = stub.GetJob(job_pb2.GetJobRequest(job_id=job.id), timeout=30).job
                if latest(tmp_path / "ck" / job.id) is not None and now.sockets:
                    break
                assert time.monotonic() < deadline, "no checkpoint within 60 s"
                time.sleep(0.05)
            victim = now.sockets[1].id
            served[0].agent.kill_socket(victim)
            done = wait_terminal(stub, [job.id], timeout_s=180)[job.id]
        assert done.state == SUCCEEDED, done.error_message
        assert victim not in [s.id for s in done.sockets]  # placed again, without it
        r = done.result.training
        assert r.start_step > 0 and r.steps_completed == 60  # resumed, then finished
    finally:
        server.stop(0)
        orch.stop()
        gateway.close()
        store.close()
        stop_agents(served)
