"""torchrun-style scripts on the emulated rack: each rank a socket actor, the "rdu"
process group over the gRPC links, jobs through the orchestrator."""

from __future__ import annotations

import re
import runpy
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from rdurack.v1 import common_pb2, job_pb2
from rdurack.workloads.training.job import log_path, work_dir
from tests.support.agents import ServedAgent
from tests.support.cli import rdu, rdu_json
from tests.support.control import CANCELLED, FAILED, SUCCEEDED, Control, submit, wait_terminal

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "ddp_script.py"


@pytest.fixture(scope="module")
def trainer(control: Control, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    """The control plane's orchestrator, with a directory for its jobs' files."""
    control.orchestrator.checkpoint_dir = tmp_path_factory.mktemp("jobs")
    yield control
    control.orchestrator.checkpoint_dir = None


def run(
    control: Control,
    source: str | bytes,
    world: int,
    *args: str,
    timeout_s: float = 300,
    wall_timeout_s: float = 0.0,
    timeout_late_s: float = 0.0,
    run_timeout_s: float = 0.0,
) -> job_pb2.Job:
    spec = script_job(source, world, *args, wall_timeout_s=wall_timeout_s,
                      timeout_late_s=timeout_late_s, run_timeout_s=run_timeout_s)  # fmt: skip
    job = submit(control.jobs, spec)
    return wait_terminal(control.jobs, [job.id], timeout_s=timeout_s)[job.id]


def script_job(
    source: str | bytes,
    world: int,
    *args: str,
    wall_timeout_s: float = 0.0,
    timeout_late_s: float = 0.0,
    run_timeout_s: float = 0.0,
) -> job_pb2.JobSpec:
    text = source if isinstance(source, bytes) else source.encode()
    return job_pb2.JobSpec(
        name="script-test",
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
        training=job_pb2.TrainingJob(
            world_size=world,
            script=text,
            script_name="train.py",
            script_args=list(args),
            wall_timeout_s=wall_timeout_s,
            timeout_s=timeout_late_s,
            run_timeout_s=run_timeout_s,
        ),
    )


def job_dir(control: Control, job: job_pb2.Job) -> Path:
    root = control.orchestrator.checkpoint_dir
    assert root is not None
    return root / job.id


# First: the module's `trainer` gives the orchestrator a job directory from then on.
def test_a_script_needs_a_job_directory_and_is_refused_without_one(control: Control) -> None:
    assert control.orchestrator.checkpoint_dir is None
    with pytest.raises(grpc.RpcError) as refused:
        run(control, "print('hi')\n", 2)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "checkpoint directory" in str(refused.value.details())


@pytest.mark.timeout(600)
def test_a_gpu_script_runs_on_16_sockets_and_trains_like_one_process(trainer: Control) -> None:
    epochs, lr = 6, 0.05
    job = run(trainer, EXAMPLE.read_bytes(), 16, "--epochs", str(epochs), "--lr", str(lr))
    assert job.state == SUCCEEDED, job.error_message
    assert len({s.node_index for s in job.sockets}) == 2
    final = torch.load(work_dir(job_dir(trainer, job)) / "final.pt")
    # One process, the whole dataset each step: what DDP over 16 shards must equal.
    example = runpy.run_path(str(EXAMPLE))
    data, net = example["dataset"](), example["model"]()
    x, y = data.tensors
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
    for name, p in net.state_dict().items():
        rel = float((final[name] - p).norm() / p.norm())
        assert rel <= 1e-5, (name, rel)
    r = job.result.training
    assert r.world_size == 16 and not r.diagnostics, list(r.diagnostics)
    assert r.steps_completed == epochs and r.step_time_s > 0
    assert 0 < r.exposed_allreduce_s <= r.allreduce_s and r.compute_s > 0
    assert r.memory.weights == 4 * (8 * 16 + 16 + 16 + 1)  # the model's float32 parameters
    assert r.memory.gradients == r.memory.weights and r.memory.activations > 0
    assert r.peak_hbm_bytes >= r.memory.total > 0
    log = log_path(job_dir(trainer, job), 0).read_text()
    assert f"epoch {epochs - 1} local rank 0 loss" in log
    # What the user reads: `rdu logs`, over JobService.
    address = trainer.server.address
    one = rdu("logs", job.id, "--rank", "0", "--address", address)
    assert one.returncode == 0 and one.stdout == log, one.stderr
    every = rdu_json("logs", job.id, "--address", address)
    assert [g["rank"] for g in every] == list(range(16))  # every rank's, rank 0's printed
    assert every[0]["text"] == log and every[5]["text"] == ""


MISTAKES = {
    # DDP told not to broadcast rank 0's parameters, ranks seeded apart.
    "replicas-differ": (
        "torch.manual_seed(dist.get_rank())\n"
        "net = DDP(torch.nn.Linear(4, 1), init_sync=False)\n"
        "x, y = torch.ones(8, 4), torch.zeros(8, 1)\n"
    ),
    # Every rank reads the whole dataset: no DistributedSampler.
    "duplicate-samples": (
        "net = DDP(torch.nn.Linear(4, 1))\nx, y = torch.ones(8, 4), torch.zeros(8, 1)\n"
    ),
    # Every rank saves the same checkpoint.
    "every-rank-checkpoints": (
        "net = DDP(torch.nn.Linear(4, 1))\n"
        "x, y = torch.ones(8, 4) * dist.get_rank(), torch.zeros(8, 1)\n"
        "torch.save(net.module.state_dict(), 'checkpoint.pt')\n"
    ),
}
PRELUDE = (
    "import torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "dist.init_process_group('rdu')\n"
)
STEP = (
    "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
    "for _ in range(2):\n"
    "    opt.zero_grad()\n"
    "    torch.nn.functional.mse_loss(net(x), y).backward()\n"
    "    opt.step()\n"
)


@pytest.mark.parametrize("code", sorted(MISTAKES))
def test_each_mistake_is_diagnosed_by_name(trainer: Control, code: str) -> None:
    job = run(trainer, PRELUDE + MISTAKES[code] + STEP, 4)
    assert job.state == SUCCEEDED, job.error_message
    assert [d.code for d in job.result.training.diagnostics] == [code]


def test_the_correct_script_gets_no_diagnostic(trainer: Control) -> None:
    correct = (
        "net = DDP(torch.nn.Linear(4, 1))\n"
        "x, y = torch.ones(8, 4) * dist.get_rank(), torch.zeros(8, 1)\n"
        "if dist.get_rank() == 0:\n"
        "    torch.save(net.module.state_dict(), 'checkpoint.pt')\n"
    )
    job = run(trainer, PRELUDE + correct + STEP, 4)
    assert job.state == SUCCEEDED, job.error_message
    assert list(job.result.training.diagnostics) == []


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (
            "dist.init_process_group('rdu', world_size=8, rank=dist_rank)",
            "two-processes-per-socket",
        ),
        (
            "dist.init_process_group('rdu', world_size=3, rank=min(dist_rank, 2))",
            "wrong-world-size",
        ),
        ("dist.init_process_group('rdu', world_size=4, rank=(dist_rank + 1) % 4)", "wrong-rank"),
    ],
)
def test_a_group_the_job_cannot_be_is_refused_by_name(
    trainer: Control, call: str, code: str
) -> None:
    source = f"import os, torch.distributed as dist\ndist_rank = int(os.environ['RANK'])\n{call}\n"
    job = run(trainer, source, 4, timeout_s=120)
    assert job.state == FAILED
    assert f"[{code}]" in job.error_message, job.error_message


def test_a_straggler_past_the_timeout_is_named(trainer: Control, rack: list[ServedAgent]) -> None:
    source = (
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('rdu')\n"
        "net = DDP(torch.nn.Linear(64, 64))\n"
        "x = torch.ones(32, 64) * dist.get_rank()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    net(x).sum().backward()\n"
        "    opt.step()\n"
    )
    healthy = run(trainer, source, 4)
    assert healthy.state == SUCCEEDED, healthy.error_message
    slow = healthy.sockets[2].id  # the next job's rank 2, slowed 10x
    agent = rack[healthy.sockets[2].node_index].agent
    agent.slow_socket(slow, 10.0)
    try:
        # Its forward and first backward kernel end 9 times their time late. (The job's
        # timeout_s: init_process_group's timeout bounds lateness too, but torch also
        # gives it to the store's connection, which a few microseconds cannot make.)
        lag_s = 9 * healthy.result.training.compute_s / 3
        failed = run(trainer, source, 4, timeout_late_s=lag_s / 4)
        assert failed.state == FAILED
        assert "[straggler-timeout]" in failed.error_message, failed.error_message
        assert f"rank 2 ({slow})" in failed.error_message
    finally:
        agent.slow_socket(slow, 1.0)


def test_a_rank_that_raises_fails_the_job_with_its_own_error_not_a_timeout(
    trainer: Control,
) -> None:
    source = (
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('rdu')\n"
        "if dist.get_rank() == 2:\n"
        "    raise ValueError('shard 2 is corrupt')\n"
        "dist.barrier()  # the others wait here for rank 2\n"
    )
    job = run(trainer, source, 4, wall_timeout_s=600, timeout_s=500)
    assert job.state == FAILED
    assert "rank 2" in job.error_message and "shard 2 is corrupt" in job.error_message
    # The others did not wait out their 600 s for rank 2 (the test's own wait is 500 s):
    # the job ended when rank 2 failed.


# Trains until something stops it: the job's cancellation or its run_timeout_s.
ENDLESS = """
import torch
import torch.distributed as dist

dist.init_process_group("rdu")
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
"""


def _stopped_in_logs(control: Control, job: job_pb2.Job, why: str, world: int) -> bool:
    """Every rank's log says its script stopped for `why` (written as its thread ends,
    after the job's end: waited for with a deadline)."""
    deadline = time.monotonic() + 60
    logs = [log_path(job_dir(control, job), r) for r in range(world)]
    while time.monotonic() < deadline:
        if all(p.exists() and f"stopped: {why}" in p.read_text() for p in logs):
            return True
        time.sleep(0.1)
    return False


def test_a_running_script_shows_its_steps_and_stops_when_cancelled(trainer: Control) -> None:
    job = submit(trainer.jobs, script_job(ENDLESS, 2, wall_timeout_s=30))
    steps: list[int] = []
    events = trainer.jobs.WatchJob(job_pb2.WatchJobRequest(job_id=job.id), timeout=240)
    for event in events:
        said = event.progress.message if event.WhichOneof("event") == "progress" else ""
        if match := re.fullmatch(r"step (\d+)", said):  # a script's total is its own
            steps.append(int(match[1]))
            if steps[-1] >= 3:
                trainer.jobs.CancelJob(job_pb2.CancelJobRequest(job_id=job.id, reason="enough"))
                break
    events.cancel()
    assert steps == sorted(steps) and steps[-1] >= 3, steps  # live, while it ran
    done = wait_terminal(trainer.jobs, [job.id], timeout_s=120)[job.id]
    assert done.state == CANCELLED, done.error_message
    assert _stopped_in_logs(trainer, done, "its job ended", 2)
    # Its sockets are free for the next script.
    again = run(trainer, "import torch.distributed as d\nd.init_process_group('rdu')\n", 2)
    assert again.state == SUCCEEDED, again.error_message


def test_a_script_past_its_run_timeout_is_stopped_and_fails_the_job(trainer: Control) -> None:
    job = run(trainer, ENDLESS, 2, wall_timeout_s=30, run_timeout_s=3)
    assert job.state == FAILED
    assert "stopped: it ran past run_timeout_s (3 s)" in job.error_message, job.error_message
    assert "rank 0" in job.error_message or "rank 1" in job.error_message
