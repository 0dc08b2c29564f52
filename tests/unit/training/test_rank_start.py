"""Every rank of a DDP job starts (its training stack imported, its runner built) before
any rank waits for a peer: a rank still starting is not a dead one. Before, the ranks
started in their first step, and 32 of them starting at once on two cores kept their
peers waiting past the 60 s wall_timeout_s: the job's first attempt failed.

The orchestrator runs here on the fake rack, its training calls on real Socket objects
(no Ray), one per rank, in threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.jobs import JobSpec, JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.results import TrainingResult
from rdurack.workloads.training.job import RankReport, TrainingWorkload
from tests.support.fake_rack import RACK, FakeGateway, stepped, wait_for


class SocketTraining(FakeGateway):
    """FakeGateway whose training calls run on a real Socket per rank, and which records
    each call as (node, prepare) in the order they began."""

    def __init__(self) -> None:
        super().__init__()
        self.sockets: dict[str, Socket] = {}
        self.calls: list[tuple[int, bool]] = []

    def train(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: TrainingWorkload,
        group: Sequence[tuple[str, str]],
        *,
        platform_name: str = "",
        steps: int = 0,
        start_ns: int = 0,
        checkpoint_dir: str = "",
        prepare: bool = False,
    ) -> list[RankReport]:
        ranks = [sid for sid, _ in group]
        with self.lock:
            self.calls.append((node, prepare))
            if not self.sockets:  # every rank's socket, linked to the others
                self.sockets = {sid: Socket(sid, RACK, timeout_s=10.0) for sid in ranks}
                peers = {sid: s.address() for sid, s in self.sockets.items()}
                for s in self.sockets.values():
                    s.connect(peers)
            for sid in sockets:
                self.sockets[sid].reserve(job_id)

        def rank(sid: str) -> RankReport:
            return self.sockets[sid].train(
                job_id, workload, ranks, platform_name=platform_name, steps=steps,
                start_ns=start_ns or None, checkpoint_dir=checkpoint_dir, prepare=prepare,
            )  # fmt: skip

        with ThreadPoolExecutor(len(sockets)) as pool:
            return list(pool.map(rank, sockets))

    def close(self) -> None:
        for s in self.sockets.values():
            s.close()


@pytest.fixture
def gateway() -> Iterator[SocketTraining]:
    g = SocketTraining()
    try:
        yield g
    finally:
        g.close()


@pytest.fixture
def orchestrator(gateway: SocketTraining, tmp_path: Path) -> Iterator[Orchestrator]:
    with stepped(tmp_path / "jobs.sqlite", gateway) as o:
        yield o


def test_every_node_starts_its_ranks_before_any_rank_steps(
    orchestrator: Orchestrator, gateway: SocketTraining
) -> None:
    # 16 ranks: the job spans both nodes of the fake rack.
    w = TrainingWorkload(world_size=16, global_batch=32, steps=3)
    job, _ = orchestrator.submit(JobSpec(workload=w, payload_mode="functional"))
    assert orchestrator.schedule_once() == 1
    assert wait_for(orchestrator, job.id, timeout_s=120) is JobState.SUCCEEDED
    starts = [c for c in gateway.calls if c[1]]
    assert sorted(n for n, _ in starts) == [0, 1]  # one start call a node
    assert gateway.calls[:2] == starts, gateway.calls  # both before any step
    assert len(gateway.calls) > 2  # and then the steps, on both nodes
    result = orchestrator.get(job.id).result
    assert isinstance(result, TrainingResult)
    assert result.steps_completed == 3 and len(result.losses) == 3
    events = [e for e in orchestrator.events(job.id) if e.kind == "progress"]
    assert events[0].payload["message"] == "starting 16 ranks"


def test_a_started_rank_has_run_no_step_and_its_steps_follow(tmp_path: Path) -> None:
    group = ["rdu-n0-s0", "rdu-n0-s1"]
    made = [Socket(sid, RACK, timeout_s=10.0) for sid in group]
    peers = {s.name: s.address() for s in made}
    w = TrainingWorkload(world_size=2, global_batch=8, steps=2)
    try:
        for s in made:
            s.connect(peers)
            s.reserve("job")
        # Rank 0 alone: starting meets no peer, so it returns while rank 1 is idle.
        started = made[0].train("job", w, group, prepare=True)
        assert (started.step, started.losses, started.finished) == (0, [], False)
        made[1].train("job", w, group, prepare=True)
        reports: list[RankReport] = []
        lock = threading.Lock()

        def rank(s: Socket) -> None:
            report = s.train("job", w, group)  # 0 steps: to the end
            with lock:
                reports.append(report)

        threads = [threading.Thread(target=rank, args=(s,)) for s in made]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(reports) == 2 and all(r.finished and r.step == 2 for r in reports), reports
        assert all(len(r.losses) == 2 for r in reports)  # each rank's own batches' losses
    finally:
        for s in made:
            s.close()
