"""Which orchestrator replica leads: a lease in the job store, claimed and renewed.

Every replica serves reads and watches and accepts submissions; only the leader runs
scheduling rounds and supervises runs (orchestrator.py). Each replica's `Elector`
claims the lease (store/lease.py) every `ttl_s / RENEWALS_PER_TTL` seconds: the leader
renews its term, the others take the lease over once it has expired on the database's
clock.

Why a lease in the store rather than PostgreSQL's advisory locks: an advisory lock
belongs to one connection, so a pooled connection that breaks drops it silently and the
process learns of it only when it next asks, while the lease's epoch is a fencing token
that every write of a term checks in its own transaction, on SQLite and PostgreSQL the
same (one code path for both stores, and a single replica on SQLite is simply a leader
nobody contends with).

When a leader stops leading, by its own clock: its term lapses locally `STEP_DOWN` of a
TTL before the database lets another replica take the lease. The local deadline counts
from the moment the renewal was sent, so it is earlier than the lease's expiry, which
counts from when the database received it, as long as the two clocks' rates agree to
better than STEP_DOWN (an assumption: real clocks drift by parts per million). Past it,
`term()` is None and the orchestrator stops scheduling and aborts its runs; a write the
old term still attempts fails (the fence), so a deposed leader never lands a write. A
renewal that comes back after its term lapsed does not bring the term back (its runs
may have been aborted, their last writes must stay fenced): the next claim starts a new
term, whose epoch fences the old one's writes.

Takeover: a leader that dies stops renewing; its lease expires at most `ttl_s` after its
last renewal, and a follower claims it within one more claim interval, then recovers
the jobs the old leader had (store.recover) and schedules: `ttl_s * (1 + 1 /
RENEWALS_PER_TTL)` plus one recovery, 6 s with the default TTL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rdurack.errors import RdurackError
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.store.lease import Term

log = logging.getLogger(__name__)

LEASE_TTL_S = 5.0  # an assumption: a leader silent this long is taken over
RENEWALS_PER_TTL = 5  # claims per TTL: four may fail or run late before a term lapses
STEP_DOWN = 0.2  # the fraction of a TTL by which a leader stops before its lease expires


class Elector:
    """This replica's claim on the leader's lease (the module docstring).

    `holder`: the replica's name, unique among the replicas (its address by default);
    `on_change()`: called when this replica's term begins or ends by a claim (a lapse
    without a claim is seen by `term()`); `clock`: monotonic seconds."""

    def __init__(
        self,
        store: JobStore,
        holder: str,
        ttl_s: float = LEASE_TTL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        if ttl_s <= 0:
            raise RdurackError(f"the lease's TTL must be positive, not {ttl_s:g} s")
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.claim_every_s = ttl_s / RENEWALS_PER_TTL
        self.leader = ""  # the holder the last claim found ("" before any, or none)
        self._clock = clock
        self._on_change = on_change
        self._term: Term | None = None
        self._valid_until = 0.0  # clock seconds: the term lapses here without a renewal
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def takeover_bound_s(self) -> float:
        """How long after a leader's death a follower leads at most (module docstring):
        its lease's TTL, plus one claim interval."""
        return self.ttl_s + self.claim_every_s

    def term(self) -> Term | None:
        """This replica's term, while it leads by its own clock; else None."""
        with self._lock:
            if self._term is not None and self._clock() < self._valid_until:
                return self._term
            return None

    def holds(self, term: Term) -> bool:
        """Whether `term` is this replica's and has not lapsed."""
        return self.term() == term

    def step(self) -> Term | None:
        """One claim: renew this replica's term, or take the lease if it is free. A
        store that does not answer leaves the term to lapse on its deadline. Returns
        `term()` afterwards."""
        before = self.term()
        sent = self._clock()
        try:
            found = self.store.claim_lease(self.holder, self.ttl_s, before)
        except RdurackError as e:  # StoreUnavailable: try again at the next claim
            log.warning("replica %s: cannot claim the leader's lease: %s", self.holder, e)
        else:
            took = self._clock() - sent
            if took > self.claim_every_s:  # a few of these in a row and a term lapses
                log.warning(
                    "replica %s: a claim of the lease took %.1f s (the store's write); a "
                    "term lapses %.1f s after its last renewal was sent",
                    self.holder, took, self.ttl_s * (1 - STEP_DOWN),
                )  # fmt: skip
            with self._lock:
                self.leader = found.holder if found.live else ""
                # A term that lapsed while its renewal was on the way stays over: its
                # runs may have been aborted already, and their last writes must stay
                # fenced. The next claim starts a new term (a new epoch).
                lapsed = found.term == before and self._clock() >= self._valid_until
                if found.holder == self.holder and found.live and not lapsed:
                    self._term = found.term
                    self._valid_until = sent + self.ttl_s * (1 - STEP_DOWN)
                else:
                    self._term = None
            if lapsed:
                log.warning(
                    "replica %s: term %d lapsed while its renewal was on the way; the next "
                    "claim starts a new term",
                    self.holder, found.epoch,
                )  # fmt: skip
        after = self.term()
        if after != before:
            log.warning(
                "replica %s: %s", self.holder, f"leads, term {after.epoch}" if after else "follows"
            )
            self._on_change()
        return after

    def start(self) -> None:
        """Claim on a thread of its own, every `claim_every_s` seconds: a long
        scheduling round never delays a renewal."""
        self._thread = threading.Thread(target=self._loop, name="elector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming, and end this replica's term now if it leads, so a follower
        takes over without waiting for the lease to expire."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        term = self.term()
        with self._lock:
            self._term = None
        if term is not None:
            try:
                self.store.release_lease(term)
            except RdurackError as e:  # it expires on its own
                log.warning("replica %s: lease not released: %s", self.holder, e)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # the loop must survive anything; the next claim retries
                log.exception("replica %s: claim failed", self.holder)
            self._stop.wait(self.claim_every_s)
