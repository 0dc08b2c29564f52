"""A watcher whose client goes away ends its watch at once, not at its next poll: a
WatchJob stream cancelled by its client frees its server thread for the next call.

The orchestrators here poll every POLL_S, far beyond the test's patience, so only the
hang-up can end a watch in time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from rdurack.api.job_service import serve_api
from rdurack.orchestrator.jobs import Job
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store.jobstore import Event
from rdurack.v1 import job_pb2, job_pb2_grpc
from tests.support.fake_rack import FakeGateway, spec, stepped

POLL_S = 600.0
DEADLINE_S = 30.0  # a call's or a join's bound: generous, for a loaded machine


@pytest.fixture
def slow_poll(tmp_path: Path) -> Iterator[Orchestrator]:
    with stepped(tmp_path / "jobs.sqlite", FakeGateway(), poll_s=POLL_S) as o:
        yield o


def test_a_hang_up_ends_the_watch_while_it_waits(
    slow_poll: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, _ = slow_poll.submit(spec(sockets=1))  # never scheduled: no news will come
    hang_ups: list[Callable[[], None]] = []
    reads: list[str] = []  # the watcher's reads of the job's events
    read_events = slow_poll.store.events

    def counted(job_id: str, after: int = 0) -> list[Event]:
        reads.append(job_id)
        return read_events(job_id, after)

    monkeypatch.setattr(slow_poll.store, "events", counted)
    checked = threading.Event()  # the watcher read the job's state: next, it waits
    read_job = slow_poll.store.get

    def noted(job_id: str) -> Job:
        found = read_job(job_id)
        checked.set()
        return found

    def register(hang_up: Callable[[], None]) -> bool:
        hang_ups.append(hang_up)
        return True

    events = slow_poll.watch(job.id, on_hang_up=register)
    assert next(events).seq == 1  # the submission
    monkeypatch.setattr(slow_poll.store, "get", noted)
    rest: list[Event] = []
    watcher = threading.Thread(target=lambda: rest.extend(events))
    watcher.start()
    assert checked.wait(DEADLINE_S)  # then it waits for news, up to POLL_S
    hang_ups[0]()
    watcher.join(DEADLINE_S)
    assert not watcher.is_alive() and rest == []
    assert reads == [job.id]  # none after the hang-up: no one would get what it read


def test_a_watch_whose_client_is_gone_already_sends_nothing(slow_poll: Orchestrator) -> None:
    job, _ = slow_poll.submit(spec(sockets=1))
    assert list(slow_poll.watch(job.id, on_hang_up=lambda hang_up: False)) == []


def test_a_cancelled_stream_frees_the_servers_one_thread(slow_poll: Orchestrator) -> None:
    job, _ = slow_poll.submit(spec(sockets=1))
    server = serve_api(slow_poll, workers=1)  # one thread for every stream
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = job_pb2_grpc.JobServiceStub(channel)
            request = job_pb2.WatchJobRequest(job_id=job.id)
            for _ in range(3):  # each needs the thread the one before held
                stream = stub.WatchJob(request, timeout=DEADLINE_S)
                assert next(stream).sequence == 1
                stream.cancel()
    finally:
        server.stop(0)
