"""`rdu serve --rack --wait-rack`: an endpoint started before its rack (a Kubernetes pod
starts in no order) waits for the orchestrator, with a bound and a line saying so, and
its endpoint job waits for sockets other jobs hold; what cannot improve by waiting (a
bad token) is not waited for. Each test moves on deadlines and events, not sleeps."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import pytest

from rdurack.api.job_service import serve_api
from rdurack.api.server import Server, channel
from rdurack.endpoint.rack import REACH_PAUSES_S, RackModel, RackNotReached, reach
from rdurack.endpoint.server import engines, on_rack
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.models import builtin_models
from rdurack.security.auth import Authenticator
from rdurack.security.tls import TlsConfig
from rdurack.workloads.predictor import Predictor
from tests.support.certs import RackCerts
from tests.support.cli import CLI, ENV
from tests.support.fake_rack import RACK, FakeClock, until
from tests.support.ports import free_port
from tests.support.socket_rack import SocketGateway
from tests.support.tokens import TOKENS, write_tokens
from tests.unit.endpoint.test_on_rack import SETTING

MODEL = SETTING.model


@contextmanager
def orchestrator(
    store: Path, port: int = 0, auth: Authenticator | None = None, tls: TlsConfig | None = None
) -> Iterator[tuple[Orchestrator, Server]]:
    """An orchestrator on the fake rack, its API (JobService, RackService) on `port`."""
    gateway = SocketGateway()
    o = Orchestrator(JobStore(store), gateway, RACK, heartbeat_s=None)
    o.start()
    server = serve_api(o, auth, port=port, tls=tls)
    try:
        yield o, server
    finally:
        server.stop(0)
        o.stop()
        gateway.close()
        o.store.close()


def test_the_endpoint_waits_for_an_orchestrator_started_after_it(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    said: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(reach, lambda: channel(address), address, 60.0, said.append)
        until(lambda: said, "the endpoint says it waits", 30)
        assert not waiting.done()
        waits = f"waiting up to 60 s for the orchestrator at {address} (UNAVAILABLE: "
        assert len(said) == 1 and said[0].startswith(waits), said
        with orchestrator(tmp_path / "jobs.sqlite", port):
            # Seen within one pause (at most the last) after it serves.
            rack = waiting.result(timeout=REACH_PAUSES_S[1] + 30)
    assert rack.platform == RACK.name and len(rack.nodes) == RACK.nodes
    assert len(said) == 2 and said[1].startswith(f"the orchestrator at {address} answered after")


def test_a_rack_that_never_answers_ends_the_wait_naming_it_and_the_last_error() -> None:
    """Driven by a fake clock: each pause moves it, so the bound is reached at once in
    wall time, after pauses that double from the first to the last."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens: each try is refused at once
    clock = FakeClock()
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        clock.advance(seconds)

    said: list[str] = []
    with pytest.raises(RackNotReached) as e:
        reach(lambda: channel(address), address, 10.0, said.append, clock, pause)
    assert str(e.value).startswith(
        f"the orchestrator at {address} did not answer in 10 s (--wait-rack); last: UNAVAILABLE"
    )
    assert e.value.exit_code == 1  # the rack failed, not the command line
    first, last = REACH_PAUSES_S
    assert pauses[:4] == [first, first * 2, first * 4, first * 8]
    assert max(pauses) == last and sum(pauses) == pytest.approx(10.0)
    assert len(said) == 1 and said[0].startswith("waiting up to 10 s for the orchestrator")


def test_a_ca_that_is_not_the_racks_is_waited_for_and_named(
    tmp_path: Path, rack_certs: RackCerts
) -> None:
    """gRPC reports a failed TLS handshake as UNAVAILABLE, as it does a server that is
    down: it is waited for (a pod's Secret may be replaced meanwhile), and the error
    says what the handshake met."""
    clock = FakeClock()
    with orchestrator(tmp_path / "jobs.sqlite", tls=rack_certs.member) as (_, server):
        wrong = TlsConfig(ca_file=rack_certs.foreign.ca_file)
        with pytest.raises(RackNotReached) as e:
            reach(lambda: channel(server.address, tls=wrong), server.address, 5.0,
                  lambda _: None, clock, clock.advance)  # fmt: skip
    assert "handshake failed" in str(e.value).lower(), e.value


def test_without_a_wait_a_missing_orchestrator_fails_at_once() -> None:
    address = f"127.0.0.1:{free_port()}"
    said: list[str] = []

    def never(seconds: float) -> None:
        raise AssertionError(f"paused {seconds} s without a wait")

    with pytest.raises(grpc.RpcError) as e:
        reach(lambda: channel(address), address, 0.0, said.append, pause=never)
    assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert said == []


def test_a_refused_token_is_not_waited_for(tmp_path: Path) -> None:
    auth = Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml"))
    with orchestrator(tmp_path / "jobs.sqlite", auth=auth) as (_, server):
        said: list[str] = []
        with pytest.raises(grpc.RpcError) as e:
            reach(lambda: channel(server.address, token="not-a-token"), server.address, 60.0,
                  said.append)  # fmt: skip
        assert isinstance(e.value, grpc.Call)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and said == []
        good = reach(lambda: channel(server.address, token=TOKENS["alice"]), server.address,
                     60.0, said.append)  # fmt: skip
        assert good.platform == RACK.name and said == []  # answered at once: nothing to say


def test_an_endpoint_job_waits_for_sockets_other_jobs_hold(tmp_path: Path) -> None:
    """Two endpoint jobs of 8 sockets hold the rack's 16; a third says it waits, and runs
    once one of them is released."""
    assert (SETTING.sockets, RACK.sockets) == (8, 16)
    with orchestrator(tmp_path / "jobs.sqlite") as (o, server), channel(server.address) as ch:
        models = [
            on_rack(engines(Predictor(RACK), [MODEL], SETTING, builtin_models(), rack=ch))[0]
            for _ in range(3)
        ]
        first, second, third = models
        first.hold()
        second.hold()
        said: list[str] = []
        third.say = said.append
        with ThreadPoolExecutor(1) as pool:
            holding = pool.submit(third.hold)
            until(lambda: said, "the third says it waits", 30)
            assert not holding.done()
            assert said[0].endswith("; waiting up to 60 s for its 8 socket(s)"), said
            assert " is pending;" in said[0]
            first.release()
            job_id = holding.result(timeout=60)
        assert o.get(job_id).state is JobState.RUNNING
        for m in (second, third):
            m.release()
        until(lambda: o.get(job_id).state is JobState.CANCELLED, "released")


def test_rdu_serve_started_before_its_rack_serves_on_it_once_it_is_up(
    tmp_path: Path, rack_certs: RackCerts
) -> None:
    """As the Kubernetes pod runs it: `--rack --wait-rack`, the rack's CA and a token
    file in the connection options' variables; the orchestrator (TLS, tokens) starts
    after it. It says it waits, then holds its socket as the token's tenant, serves, and
    releases the socket on SIGTERM."""
    port, http_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    token_file = tmp_path / "token"
    token_file.write_text(TOKENS["alice"] + "\n")
    env = {**ENV, "RDURACK_TLS_CA": str(rack_certs.member.ca_file),
           "RDURACK_TOKEN_FILE": str(token_file)}  # fmt: skip
    args = ["serve", "--rack", "--address", address, "--wait-rack", "60", "--model",
            "llama3.1-8b", "--sockets", "1", "--time-scale", "0",
            "--port", str(http_port)]  # fmt: skip
    log = tmp_path / "serve.log"
    auth = Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml"))
    with log.open("w") as out:
        proc = subprocess.Popen([*CLI, *args], env=env, stderr=out, stdout=out, text=True)

    def said() -> str:
        return log.read_text()

    try:
        until(lambda: "waiting up to 60 s" in said() or proc.poll() is not None, "waits", 60)
        assert proc.poll() is None, said()
        assert f"waiting up to 60 s for the orchestrator at {address} (UNAVAILABLE" in said()
        with orchestrator(tmp_path / "jobs.sqlite", port, auth, rack_certs.member) as (o, _):
            until(lambda: "endpoint ready at" in said() or proc.poll() is not None, "ready", 90)
            assert proc.poll() is None, said()
            body = {"model": "llama3.1-8b", "prompt": "hi", "max_tokens": 2}
            done = httpx.post(f"http://127.0.0.1:{http_port}/v1/completions", json=body,
                              timeout=30)  # fmt: skip
            assert done.json()["usage"]["completion_tokens"] == 2, done.text
            (job,) = o.jobs(tenant="alice")
            assert job.state is JobState.RUNNING and len(job.sockets) == 1
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 128 + signal.SIGTERM
            assert o.get(job.id).state is JobState.CANCELLED  # released before it exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = said()
    assert f"the orchestrator at {address} answered after" in text
    assert f"on 1 sn40l-rack16 sockets each of the rack at {address}" in text
    assert "Traceback" not in text


def _third_waits(ch: grpc.Channel) -> tuple[RackModel, RackModel, list[str]]:
    """Two endpoint jobs of 8 sockets hold the rack's 16 (the first's and a second's);
    a third, patient, will say what it waits for into the list."""
    first, second, third = [
        on_rack(engines(Predictor(RACK), [MODEL], SETTING, builtin_models(), rack=ch))[0]
        for _ in range(3)
    ]
    first.hold()
    second.hold()
    said: list[str] = []
    third.say, third.patient = said.append, True
    return first, third, said


def test_a_patient_hold_rides_over_an_orchestrator_that_stops_answering(tmp_path: Path) -> None:
    """The orchestrator's API goes away while an endpoint job waits for sockets (a
    restart, as the endpoint starts); the hold asks again, gets the same job once it
    answers, and submits no second one."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    with orchestrator(tmp_path / "jobs.sqlite", port) as (o, server), channel(address) as ch:
        first, third, said = _third_waits(ch)
        with ThreadPoolExecutor(1) as pool:
            holding = pool.submit(third.hold)
            until(lambda: said, "the third says it waits", 30)
            server.stop(0)
            # A hold that gave up fails here with its error, not after the pool's wait.
            until(lambda: len(said) > 1 or holding.done(), "the third says it is away", 30)
            assert not holding.done(), holding.exception()
            assert said[1].startswith(f"{MODEL}: the orchestrator did not answer (UNAVAILABLE)")
            assert first.job_id is not None
            o.cancel(first.job_id)  # its sockets are free while the API is away
            back = serve_api(o, port=port)
            try:
                job_id = holding.result(timeout=90)
            finally:
                back.stop(0)
        assert o.get(job_id).state is JobState.RUNNING
        assert len(o.jobs()) == 3  # the first, the second, and the third's one job


class _Cancelled(grpc.RpcError, grpc.Call):
    """What a call in flight gets from a server that stops (`server.stop(0)`)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return "CANCELLED"

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    # The stubs' RpcError and Call disagree on the metadata's type; it is empty.
    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:  # type: ignore[override]
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


class _StoppingJobs:
    """The orchestrator's JobService, whose first GetJob is cancelled as by a stopping
    server (that race failed a full test run: the hold gave up)."""

    def __init__(self, jobs: object) -> None:
        self.jobs, self.cancelled = jobs, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.jobs, name)

    def GetJob(self, *args: object, **kwargs: object) -> object:  # noqa: N802 (gRPC's name)
        if not self.cancelled:
            self.cancelled += 1
            raise _Cancelled()
        return self.jobs.GetJob(*args, **kwargs)  # type: ignore[attr-defined]


def test_a_patient_hold_asks_again_after_a_call_the_stopping_server_cancelled(
    tmp_path: Path,
) -> None:
    with orchestrator(tmp_path / "jobs.sqlite") as (o, server), channel(server.address) as ch:
        first, third, said = _third_waits(ch)
        third.jobs = _StoppingJobs(third.jobs)  # type: ignore[assignment]
        with ThreadPoolExecutor(1) as pool:
            holding = pool.submit(third.hold)
            asks_again = f"{MODEL}: the orchestrator did not answer (CANCELLED); asking again"
            until(
                lambda: any(line.startswith(asks_again) for line in said) or holding.done(),
                "the third says it asks again",
                30,
            )
            assert not holding.done(), holding.exception()
            first.release()
            job_id = holding.result(timeout=60)
        assert o.get(job_id).state is JobState.RUNNING and len(o.jobs()) == 3


def test_an_impatient_hold_fails_at_once(tmp_path: Path) -> None:
    """Without --wait-rack (and when the engine submits its job again mid-serving, where
    a client is waiting for a 503), an orchestrator that does not answer is an error."""
    with orchestrator(tmp_path / "jobs.sqlite") as (_, server), channel(server.address) as ch:
        (model,) = on_rack(engines(Predictor(RACK), [MODEL], SETTING, builtin_models(), rack=ch))
        server.stop(0)
        with pytest.raises(grpc.RpcError) as e:
            model.hold()
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNAVAILABLE
