"""The leader's lease and its fence, on both stores; the elector's local deadline; two
orchestrator replicas on one store: one schedules, the other takes over and recovers.

Takeovers here wait for a real lease to expire on the database's clock: the tests use a
TTL of a fraction of a second and wait on conditions with deadlines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rdurack.errors import NotLeader, StoreUnavailable
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.leadership import STEP_DOWN, Elector
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.store.lease import Lease, Term
from tests.support.fake_rack import FakeClock, FakeGateway, over, spec, stepped, until
from tests.support.store import S
from tests.support.store import spec as store_spec

SHORT_TTL_S = 0.3  # a lease that expires within a test's patience


def _taken(store: JobStore, holder: str, ttl_s: float = SHORT_TTL_S) -> Lease:
    """Claim until `holder` holds the lease (the previous term must expire first)."""
    got: list[Lease] = []

    def claimed() -> bool:
        got.append(store.claim_lease(holder, ttl_s))
        return got[-1].holder == holder

    until(claimed, f"{holder} takes the lease")
    return got[-1]


# ------------------------------------------------------------------ the lease


def test_one_holder_at_a_time_and_a_new_epoch_per_term(store: JobStore) -> None:
    first = store.claim_lease("a", 60)
    assert (first.holder, first.epoch) == ("a", 1) and first.live
    assert store.claim_lease("b", 60).term == Term("a", 1)  # b finds a's live term
    renewed = store.claim_lease("a", 60, first.term)
    assert renewed.term == Term("a", 1) and renewed.expires_s >= first.expires_s
    store.release_lease(first.term)  # a stops: its term ends now
    assert not store.lease().live
    assert store.claim_lease("b", 60).term == Term("b", 2)
    # a's old term is over: renewing it finds b's.
    assert store.claim_lease("a", 60, first.term).term == Term("b", 2)


def test_an_expired_lease_is_taken_over(store: JobStore) -> None:
    a = store.claim_lease("a", SHORT_TTL_S)
    b = _taken(store, "b")
    assert b.epoch == a.epoch + 1
    assert b.expires_s > b.now_s  # b's term runs on the database's clock


def test_a_restarted_holder_starts_a_new_term_at_once(store: JobStore) -> None:
    """Same name, no term in hand: the replica restarted, and its old term's runs died
    with it; it need not wait for its own lease to expire."""
    old = store.claim_lease("a", 60)
    new = store.claim_lease("a", 60, None)
    assert new.term == Term("a", old.epoch + 1)


def test_a_deposed_leaders_write_fails_and_writes_nothing(store: JobStore) -> None:
    store.submit("j1", store_spec())
    a = store.claim_lease("a", SHORT_TTL_S)
    as_a = store.fenced(a.term, lambda term: True)
    as_a.transition("j1", S.SCHEDULED, sockets=("rdu-n0-s0",))
    b = _taken(store, "b")
    with pytest.raises(NotLeader, match=r"term 1 as leader has ended.*held by b \(term 2\)"):
        as_a.transition("j1", S.RUNNING, attempts=1)
    assert store.get("j1").state is S.SCHEDULED
    as_b = store.fenced(b.term, lambda term: True)
    as_b.transition("j1", S.RUNNING, attempts=1)
    terms = [e.payload.get("term") for e in store.events("j1")]
    assert terms == [None, 1, 2]  # the submission is no term's; each move records its own


def test_a_term_lapsed_on_its_own_clock_writes_nothing(store: JobStore) -> None:
    store.submit("j1", store_spec())
    a = store.claim_lease("a", 60)
    lapsed = store.fenced(a.term, lambda term: False)
    with pytest.raises(NotLeader, match="has lapsed"):
        lapsed.transition("j1", S.CANCELLED)
    assert store.get("j1").state is S.PENDING


def test_a_submission_is_not_fenced(store: JobStore) -> None:
    # Every replica accepts submissions, leader or not: a lapsed term's view too.
    a = store.claim_lease("a", 60)
    lapsed = store.fenced(a.term, lambda term: False)
    job, created = lapsed.submit("j1", store_spec())
    assert created and store.get("j1").seq == job.seq
    assert [e.payload for e in store.events("j1")] == [{"state": "PENDING"}]


# ------------------------------------------------------------------ the elector


def test_a_leader_stops_before_its_lease_can_be_taken(store: JobStore) -> None:
    clock = FakeClock()
    changes: list[Term | None] = []
    a = Elector(store, "a", 60, clock=clock, on_change=lambda: changes.append(a.term()))
    term = a.step()
    assert term == Term("a", 1) and changes == [term]
    clock.advance(60 * (1 - STEP_DOWN) - 0.001)
    assert a.term() == term
    clock.advance(0.002)  # its own deadline: 20% of the TTL before the lease expires
    assert a.term() is None
    assert store.lease().live and store.claim_lease("b", 60).holder == "a"  # not yet taken
    assert a.step() == Term("a", 2)  # it claims again: a new term, not the lapsed one


class _SlowClaims:
    """A job store whose claims take `took_s` on the elector's clock (a slow disk)."""

    def __init__(self, store: JobStore, clock: FakeClock, took_s: float) -> None:
        self.store, self.clock, self.took_s = store, clock, took_s

    def claim_lease(self, holder: str, ttl_s: float, term: Term | None = None) -> Lease:
        self.clock.advance(self.took_s)
        return self.store.claim_lease(holder, ttl_s, term)


def test_a_slow_claim_is_logged_with_how_long_it_took(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    a = Elector(_SlowClaims(store, clock, 0.5), "a", 5, clock=clock)  # type: ignore[arg-type]
    assert a.step() == Term("a", 1)
    assert "took" not in caplog.text  # half a claim interval (1 s): not worth a word
    slow = Elector(_SlowClaims(store, clock, 2.5), "a", 5, clock=clock)  # type: ignore[arg-type]
    slow.step()
    assert "a claim of the lease took 2.5 s" in caplog.text
    assert "lapses 4.0 s after its last renewal was sent" in caplog.text


def test_a_renewal_back_after_its_term_lapsed_does_not_bring_the_term_back(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen on a loaded machine: a renewal stuck in the store's commit came back after
    the term had lapsed; the orchestrator had aborted the term's runs and recovered
    their jobs, and a stale run's write, made in the term it renewed, marked a
    recovered job FAILED."""
    store.submit("j1", store_spec())
    clock = FakeClock()
    claims = _SlowClaims(store, clock, 0.0)
    a = Elector(claims, "a", 5, clock=clock)  # type: ignore[arg-type]
    first = a.step()
    assert first == Term("a", 1)  # valid until 4.0 s on its clock
    claims.took_s = 3.9
    assert a.step() == first  # back at 3.9 s, before the deadline: renewed
    claims.took_s = 0.2  # sent at 3.9 s, back at 4.1 s: the term lapsed meanwhile
    assert a.step() is None
    assert "term 1 lapsed while its renewal was on the way" in caplog.text
    assert store.lease().term == first and store.lease().live  # renewed in the store...
    claims.took_s = 0.0
    assert a.step() == Term("a", 2)  # ...but the next claim starts a new term
    with pytest.raises(NotLeader):  # which fences the lapsed one's writes
        store.fenced(first, lambda term: True).transition("j1", S.SCHEDULED, sockets=("s",))


def test_a_follower_takes_over_when_the_leader_falls_silent(store: JobStore) -> None:
    a = Elector(store, "a", SHORT_TTL_S)
    b = Elector(store, "b", SHORT_TTL_S)
    assert a.step() == Term("a", 1)
    assert b.step() is None and b.leader == "a"
    until(lambda: b.step() is not None, "b takes over")  # a stopped renewing
    assert b.term() == Term("b", 2) and a.step() is None and a.leader == "b"


class _CutOff:
    """A job store the replica cannot reach for its claims (a partition)."""

    def claim_lease(self, holder: str, ttl_s: float, term: Term | None = None) -> Lease:
        raise StoreUnavailable("job store: connection refused")


# ------------------------------------------------------------------ two replicas

Replicas = tuple[Orchestrator, Orchestrator]


@pytest.fixture
def gateway() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def replicas(
    store_location: str, gateway: FakeGateway, request: pytest.FixtureRequest
) -> Iterator[Replicas]:
    """Replicas a and b on one store and one rack, stepped; a started first and leads.
    Their lease's TTL is the test's `ttl` mark (default 60 s: no takeover on a loaded
    machine, whose threads may wait seconds for a core)."""
    mark = request.node.get_closest_marker("ttl")
    ttl_s = mark.args[0] if mark else 60.0
    with (
        stepped(store_location, gateway, replica="a", lease_ttl_s=ttl_s) as a,
        stepped(store_location, gateway, replica="b", lease_ttl_s=ttl_s) as b,
    ):
        yield a, b


def test_only_the_leader_schedules_and_a_follower_accepts(replicas: Replicas) -> None:
    a, b = replicas
    assert a.leading and not b.leading
    job, _ = b.submit(spec(steps=5))  # accepted by the follower, stored for the leader
    assert b.schedule_once() == 0
    assert a.schedule_once() == 1
    until(lambda: b.get(job.id).state is JobState.SUCCEEDED, "the job ends, seen from b")
    with pytest.raises(NotLeader, match="replica b does not lead; a does") as info:
        b.run_passes(job.id, 0, [], 0)
    assert info.value.leader == "a"


@pytest.mark.ttl(2.0)  # a's term lapses after 1.6 s cut off; none before, even loaded
def test_a_cut_off_leader_stops_and_the_next_recovers_its_run(
    replicas: Replicas, gateway: FakeGateway
) -> None:
    a, b = replicas
    gateway.gate.clear()  # the run waits at the gate until the test opens it
    job, _ = a.submit(spec(steps=5))
    assert a.schedule_once() == 1
    until(lambda: gateway.held_at_gate(job.id), "a's run reaches its sockets")
    # Neither can reach the store for its claims: a's term lapses on a's clock, and
    # nobody takes the lease until the test lets b.
    a.elector.store = b.elector.store = _CutOff()  # type: ignore[assignment]
    until(lambda: a.elector.term() is None, "a's term lapses")
    assert a.schedule_once() == 0 and not a.leading  # a stops: its run is aborted
    until(lambda: over(a, job.id), "a's run stopped and released its sockets")
    assert b.get(job.id).state is JobState.RUNNING  # a's last write was fenced
    b.elector.store = b.store
    gateway.gate.set()
    until(lambda: b.schedule_once() == 1, "b takes over and places the job again")
    until(lambda: b.get(job.id).state is JobState.SUCCEEDED, "the job ends")
    history = [
        (e.payload["state"], e.payload.get("term")) for e in b.events(job.id) if e.kind == "state"
    ]
    assert history == [
        ("PENDING", None),
        ("SCHEDULED", 1),
        ("RUNNING", 1),
        ("PENDING", 2),  # b's recovery: a's run was lost with its term
        ("SCHEDULED", 2),
        ("RUNNING", 2),
        ("SUCCEEDED", 2),
    ]
