"""Each injected fault -> its detection -> the documented outcome (docs/faults.md), on a
rack of real processes as `rdu up` starts it (2 nodes x 2 sockets, paced so that jobs
take seconds), through AdminService and JobService as a user calls them; then a short
chaos run on the same rack.

Detection times are measured and printed (`-s` shows them), and bounded only by
generous deadlines: the machine is shared, and speed is `make bench`'s business.
Every test heals what it broke, so the next one starts from a healthy rack.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from rdurack.api.server import channel
from rdurack.client.admin import AdminClient, wait_healthy
from rdurack.devtools.chaos.plan import ChaosConfig
from rdurack.devtools.chaos.run import ChaosRun, Rack
from rdurack.orchestrator.store import JobStore
from rdurack.processes import local_rack
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc
from rdurack.workloads.training.checkpoint import latest
from tests.support.cli import rdu

pytestmark = pytest.mark.integration

NODES, SOCKETS = 2, 2  # small: the suite runs on two shared cores
TIME_SCALE = 5.0  # wall s per emulated s: a kernel job of 0.5 emulated s runs 2.5 s
DEADLINE_S = 60.0  # generous: what a test waits for a state before it fails
HEALTHY = rack_pb2.SOCKET_HEALTH_HEALTHY
SUCCEEDED, FAILED = common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED
TERMINAL = {SUCCEEDED, FAILED, common_pb2.JOB_STATE_CANCELLED}


@dataclass
class Cluster:
    state_dir: Path
    address: str
    token: str  # "": the local default rack is open (no tokens file)
    channel: grpc.Channel
    jobs: job_pb2_grpc.JobServiceStub
    racks: rack_pb2_grpc.RackServiceStub
    admin: AdminClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("faults")
    procs = local_rack.up(state, NODES, SOCKETS, port=0, timeout_s=180, time_scale=TIME_SCALE)
    ch = channel(procs.orchestrator)
    try:
        token = ""
        yield Cluster(
            state,
            procs.orchestrator,
            token,
            ch,
            job_pb2_grpc.JobServiceStub(ch),
            rack_pb2_grpc.RackServiceStub(ch),
            AdminClient(ch),
        )
    finally:
        ch.close()
        local_rack.down(state)


@pytest.fixture
def healed(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, healed (agents restarted, faults ended) once the test is done."""
    yield cluster
    restarted = local_rack.restart_dead_agents(cluster.state_dir)
    wait_healthy(cluster.channel, [int(n.rsplit("-", 1)[1]) for n in restarted], DEADLINE_S)
    cluster.admin.heal()
    until(lambda: all_healthy(cluster), "the rack is healthy again")


# ------------------------------------------------------------------ helpers


def until(check: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> float:
    """Poll `check` until it is true; the wall seconds it took."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > deadline_s:
            raise AssertionError(f"not within {deadline_s:g} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def rack(c: Cluster) -> rack_pb2.RackStatus:
    return c.racks.GetRack(rack_pb2.GetRackRequest(), timeout=30).rack


def socket_status(c: Cluster, socket_id: str) -> rack_pb2.SocketStatus:
    return next(s for n in rack(c).nodes for s in n.sockets if s.ref.id == socket_id)


def all_healthy(c: Cluster) -> bool:
    r = rack(c)
    return all(n.healthy for n in r.nodes) and all(
        s.health == HEALTHY for n in r.nodes for s in n.sockets
    )


def submit(c: Cluster, spec: job_pb2.JobSpec) -> str:
    return str(c.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id)


def job(c: Cluster, job_id: str) -> job_pb2.Job:
    return c.jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=30).job


def finished(c: Cluster, job_id: str, deadline_s: float = 120.0) -> job_pb2.Job:
    until(lambda: job(c, job_id).state in TERMINAL, f"job {job_id} finishes", deadline_s)
    return job(c, job_id)


def retries(c: Cluster, job_id: str) -> list[str]:
    """The reasons of the job's retries, from the job store."""
    with JobStore(c.state_dir / "jobs.sqlite") as store:
        return [
            str(e.payload["reason"])
            for e in store.events(job_id)
            if e.kind == "state" and str(e.payload.get("reason", "")).startswith("retrying")
        ]


def watcher_saw(c: Cluster, what: str) -> float | None:
    """Wall-clock time (Unix s) of the orchestrator's health watcher's first log line
    saying `what` went down, or None: proof that the heartbeat noticed it, not only the
    agents' answers to GetRack."""
    for line in (c.state_dir / "logs" / "orchestrator.log").read_text().splitlines():
        if "rdurack.orchestrator.health" in line and f"health: {what} down" in line:
            stamp, millis = line[:23].split(",")
            return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1e3
    return None


def attempts(c: Cluster, job_id: str) -> int:
    """How many times the job was started, from the job store."""
    with JobStore(c.state_dir / "jobs.sqlite") as store:
        return store.get(job_id).attempts


def running(c: Cluster, job_id: str) -> job_pb2.Job:
    until(lambda: job(c, job_id).state == common_pb2.JOB_STATE_RUNNING, f"{job_id} runs")
    return job(c, job_id)


def decode(sockets: int, tokens: int) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="fault-kernel",
        kernel=job_pb2.KernelJob(
            model="llama2-7b",
            phase=common_pb2.PHASE_DECODE,
            sequence_length=512,
            batch_size=1,
            num_sockets=sockets,
            output_tokens=tokens,
        ),
    )


def training(world: int, steps: int, **fields: object) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="fault-train",
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
        training=job_pb2.TrainingJob(
            model="mlp",
            world_size=world,
            steps=steps,
            global_batch=32,
            **fields,  # type: ignore[arg-type]
        ),
    )


# ------------------------------------------------------------------ kill a socket


def test_a_killed_socket_is_noticed_its_job_runs_elsewhere_and_heal_restarts_it(
    healed: Cluster,
) -> None:
    c = healed
    job_id = submit(c, decode(sockets=SOCKETS, tokens=200))  # one node: it can move
    victim = running(c, job_id).sockets[1].id
    fault = c.admin.kill_socket(victim)
    noticed = until(lambda: socket_status(c, victim).health != HEALTHY, f"{victim} shown down")
    until(lambda: watcher_saw(c, victim), f"the health watcher notices {victim}")
    by_heartbeat = (watcher_saw(c, victim) or 0) - fault.injected_time.ToNanoseconds() * 1e-9
    print(
        f"\nkill-socket: {victim} shown down in GetRack after {noticed:.2f} s; "
        f"the health watcher's verdict {by_heartbeat:.2f} s after the kill"
    )
    status = socket_status(c, victim)
    assert status.health == rack_pb2.SOCKET_HEALTH_FAILED
    assert fault.id in status.health_reason and status.HasField("health_since")
    shown = rdu("status", "--json", "--address", c.address)  # what a user sees
    (row,) = [r for r in json.loads(shown.stdout)["sockets"] if r["id"] == victim]
    assert row["health"] == "FAILED" and fault.id in row["health_reason"]
    assert row["health_since_s"] == pytest.approx(status.health_since.ToNanoseconds() * 1e-9)
    done = finished(c, job_id)
    assert done.state == SUCCEEDED, done.error_message
    assert victim not in [s.id for s in done.sockets] and attempts(c, job_id) == 2
    (reason,) = retries(c, job_id)
    assert victim in reason, reason
    # Healed: the actor is restarted (a new incarnation, its clock kept) and back in use.
    before = status.incarnation
    reply = c.admin.heal(fault.id)
    assert list(reply.restarted_socket_ids) == [victim]
    until(lambda: socket_status(c, victim).health == HEALTHY, f"{victim} healthy again")
    assert socket_status(c, victim).incarnation == before + 1
    wide = finished(c, submit(c, decode(sockets=NODES * SOCKETS, tokens=4)))
    assert wide.state == SUCCEEDED and victim in [s.id for s in wide.sockets]


# ------------------------------------------------------------------ kill an agent


STEPS = 100  # enough that the job still runs when its first checkpoint is written


def test_a_killed_agent_is_noticed_training_resumes_from_its_checkpoint_and_it_comes_back(
    healed: Cluster,
) -> None:
    c = healed
    spec = training(world=SOCKETS, steps=STEPS, checkpoint_every=5, wall_timeout_s=30.0)
    job_id = submit(c, spec)
    node = running(c, job_id).sockets[0].node_index
    checkpoints = c.state_dir / "checkpoints" / job_id
    until(lambda: latest(checkpoints) is not None, "a checkpoint is written")
    fault = c.admin.kill_agent(node)
    began = time.monotonic()
    until(lambda: not rack(c).nodes[node].healthy, f"node {node} shown down")
    shown = time.monotonic() - began
    what = f"node {node}'s agent"
    until(lambda: watcher_saw(c, what), f"the health watcher notices {what}")
    by_heartbeat = (watcher_saw(c, what) or 0) - fault.injected_time.ToNanoseconds() * 1e-9
    print(
        f"\nkill-agent: node {node} shown down in GetRack after {shown:.2f} s; the health "
        f"watcher's verdict {by_heartbeat:.2f} s after the kill (0.2 s of it: the agent "
        "answers before it ends)"
    )
    down = rack(c).nodes[node]
    assert all(s.health != HEALTHY for s in down.sockets) and down.health_reason
    done = finished(c, job_id, deadline_s=240)
    assert done.state == SUCCEEDED, done.error_message
    assert {s.node_index for s in done.sockets} == {1 - node}  # ran again on the other node
    r = done.result.training
    assert r.start_step > 0 and r.steps_completed == STEPS  # resumed from its checkpoint
    assert retries(c, job_id), "the job was not retried"
    assert [f.id for f in c.admin.faults()] == [fault.id]  # until the agent is back
    # Its supervisor restarts it at the address the orchestrator knows: it re-registers
    # (a new incarnation answers the heartbeat) and its sockets return to the pool.
    local_rack.restart_agent(c.state_dir, node)
    began = time.monotonic()
    wait_healthy(c.channel, [node], DEADLINE_S)
    print(f"kill-agent: node {node} healthy again {time.monotonic() - began:.2f} s after restart")
    assert c.admin.faults() == []
    wide = finished(c, submit(c, decode(sockets=NODES * SOCKETS, tokens=4)))
    assert wide.state == SUCCEEDED, wide.error_message


# ------------------------------------------------------------------ a CoE replica dies


REQUESTS = 16


def test_a_dead_replica_s_requests_are_rerouted_to_the_other(healed: Cluster) -> None:
    c = healed
    spec = job_pb2.JobSpec(
        name="fault-coe",
        coe_inference=job_pb2.CoeInferenceJob(
            num_experts=8,
            batch_size=2,
            output_tokens=8,
            num_sockets=SOCKETS,
            tensor_parallel=1,  # two replicas of one socket on one node
            poisson=job_pb2.PoissonLoad(requests=REQUESTS, rate_per_s=100.0, seed=3),
        ),
    )
    job_id = submit(c, spec)
    sockets = [s.id for s in running(c, job_id).sockets]
    until(lambda: job(c, job_id).result.ByteSize() == 0 and progressed(c, job_id), "serving")
    victim = sorted(sockets)[-1]  # a socket of the second replica
    c.admin.kill_socket(victim)
    done = finished(c, job_id)
    assert done.state == SUCCEEDED, done.error_message
    r = done.result.coe_inference
    assert attempts(c, job_id) == 1  # not retried: the other replica served the rest
    assert list(r.failed_replicas) == [1] and r.rerouted_requests > 0
    assert r.requests == REQUESTS
    assert sorted(p.index for p in r.per_request) == list(range(REQUESTS))  # each served once
    assert all(p.replica == 0 for p in r.per_request if p.rerouted)
    assert any("re-routed" in d for d in r.diagnostics)


def progressed(c: Cluster, job_id: str) -> bool:
    """The job has reported progress (some requests served, more to come)."""
    with JobStore(c.state_dir / "jobs.sqlite") as store:
        return any(e.kind == "progress" for e in store.events(job_id))


# ------------------------------------------------------------------ slow a socket


def test_a_slow_socket_shows_in_getrack_and_slows_its_jobs_by_its_factor(healed: Cluster) -> None:
    c = healed
    every = NODES * SOCKETS  # the job takes every socket, so it gets the slow one
    base = finished(c, submit(c, decode(sockets=every, tokens=8)))
    c.admin.slow("rdu-n1-s1", 4.0)
    assert socket_status(c, "rdu-n1-s1").slowdown == 4.0
    assert socket_status(c, "rdu-n1-s1").health == HEALTHY  # slow is not down
    slow = finished(c, submit(c, decode(sockets=every, tokens=8)))
    assert base.state == slow.state == SUCCEEDED
    # Tensor parallel: every step waits for the slowest socket, 4x slower.
    assert slow.result.kernel.emulated_s == pytest.approx(4 * base.result.kernel.emulated_s)


# ------------------------------------------------------------------ links


def test_a_dropped_link_fails_a_training_job_fast_and_after_heal_it_succeeds(
    healed: Cluster,
) -> None:
    c = healed
    fault = c.admin.drop_link("rdu-n0-s0", "rdu-n1-s0")
    assert [f.id for f in c.admin.faults()] == [fault.id]
    job_id = submit(c, training(world=NODES * SOCKETS, steps=10, wall_timeout_s=300.0))
    until(lambda: retries(c, job_id), "the job is retried")
    (reason, *_) = retries(c, job_id)
    # It failed on the link at once, not after its 300 s wall timeout.
    assert "the link is down (fault injected)" in reason, reason
    c.admin.heal(fault.id)
    done = finished(c, job_id)
    assert done.state == SUCCEEDED, done.error_message


def test_a_partition_fails_a_cross_node_job_with_its_reason_after_its_attempts(
    healed: Cluster,
) -> None:
    c = healed
    c.admin.partition()
    across = finished(c, submit(c, training(world=NODES * SOCKETS, steps=4)), deadline_s=120)
    inside = finished(c, submit(c, training(world=SOCKETS, steps=4)))  # one node: unaffected
    assert across.state == FAILED and attempts(c, across.id) == 3
    assert "the link is down (fault injected)" in across.error_message
    assert inside.state == SUCCEEDED, inside.error_message


def test_a_delayed_link_adds_its_latency_to_the_steps_that_cross_it(healed: Cluster) -> None:
    c = healed
    spec = training(world=NODES * SOCKETS, steps=4)
    base = finished(c, submit(c, spec))
    c.admin.delay_link("rdu-n0-s1", "rdu-n1-s1", 1_000_000)  # a rail the ring crosses
    delayed = finished(c, submit(c, spec))
    assert base.state == delayed.state == SUCCEEDED
    extra_s = delayed.result.training.step_time_s - base.result.training.step_time_s
    print(f"\ndelay-link: 1 ms per transfer; the step took {extra_s * 1e3:.3f} ms longer")
    assert extra_s >= 1e-3  # every step's all-reduce waits for a message over it


# ------------------------------------------------------------------ chaos


def test_a_short_chaos_run_loses_no_job_and_leaves_none_hanging(healed: Cluster) -> None:
    c = healed
    config = ChaosConfig(
        seed=20240,
        nodes=NODES,
        sockets_per_node=SOCKETS,
        faults=3,
        submit_every_s=1.0,
        # The settle ends once every job has finished: a long one costs a healthy run
        # nothing, and on a loaded machine (load average 30 on 2 cores) a job retried
        # after its agent's kill was still running 20 s after healing (a full test run).
        settle_s=120.0,
        duration_s=145.0,  # a 10 s fault window: 145 - settle - the heal's reserve (15 s)
    )
    run = ChaosRun(Rack(c.address, c.token, c.state_dir), config, say=print)
    try:
        report = run.run(time.monotonic() + config.duration_s)
    finally:
        run.close()
    print("\n".join(report.lines()))
    assert report.audited and report.submitted >= 10
    injected = [f for f in report.faults if f.id]
    assert injected, "no fault was injected"
    assert not report.lost, report.lost
    assert not report.hanging, report.hanging
    assert sum(report.states.values()) == report.submitted
    assert report.ok
