"""The leader's lease in the job store: who leads, in which term, until when.

One row of the `leases` table (schema.py). A replica claims it when nobody holds it or
its holder let it expire, and renews it while it leads; each new holder's term has the
next `epoch`. Expiry is on the database's clock (`Backend.clock_s`), so replicas' clocks
need not agree. The lease is the store's, not a lock of a connection: it works the same
on SQLite and PostgreSQL, survives a pooled connection that breaks, and its epoch is a
fencing token, which the writes of a term check (`check`) in their own transaction, so
a deposed leader's write fails instead of landing (orchestrator/leadership.py says when
a leader stops).
"""

from __future__ import annotations

from dataclasses import dataclass

from rdurack.errors import NotLeader
from rdurack.orchestrator.store.backend import Backend, Db

LEADER = "leader"  # the one lease a rack's orchestrators contend for


@dataclass(frozen=True)
class Term:
    """A leader's term: its holder and epoch, the fencing token of its writes."""

    holder: str
    epoch: int


@dataclass(frozen=True)
class Lease:
    """The lease as one claim or read found it. `expires_s` and `now_s` are on the
    database's clock; `holder` is "" when nobody ever held it."""

    holder: str
    epoch: int
    expires_s: float
    now_s: float

    @property
    def term(self) -> Term:
        return Term(self.holder, self.epoch)

    @property
    def live(self) -> bool:
        return bool(self.holder) and self.expires_s > self.now_s


def claim(db: Db, backend: Backend, holder: str, ttl_s: float, term: Term | None) -> Lease:
    """Renew `term` (this holder's, if it still holds it), or start a new term for
    `holder` if the lease is free or expired; inside a write. Returns the lease as it is
    after the claim: held by `holder` or by whoever holds it still.

    A holder that restarted (same name, `term` None) starts a new term at once, even
    before its old one expires: a name is one replica's (the orchestrator's address by
    default), and its old term's runs died with it."""
    row = db.execute(
        f"SELECT holder, epoch, expires_s, {backend.clock_s} AS now_s FROM leases "
        f"WHERE name = ?{backend.lock_rows}",
        (LEADER,),
    ).fetchone()
    if row is None:
        db.execute(
            f"INSERT INTO leases (name, holder, epoch, expires_s) VALUES (?, ?, 1, "
            f"{backend.clock_s} + ?)",
            (LEADER, holder, ttl_s),
        )
        return read(db, backend)
    found = Lease(row["holder"], int(row["epoch"]), float(row["expires_s"]), float(row["now_s"]))
    if term is not None and found.term == term and found.live:
        epoch = term.epoch  # a renewal: the same term goes on
    elif not found.live or (term is None and found.holder == holder):
        epoch = found.epoch + 1  # a new term
    else:
        return found  # another replica's term, or this replica's lapsed one, now taken
    db.execute(
        f"UPDATE leases SET holder = ?, epoch = ?, expires_s = {backend.clock_s} + ? "
        "WHERE name = ?",
        (holder, epoch, ttl_s, LEADER),
    )
    return read(db, backend)


def release(db: Db, backend: Backend, term: Term) -> None:
    """End `term` now, if it is still the lease's, so another replica need not wait for
    it to expire (a replica that stops); inside a write."""
    db.execute(
        f"UPDATE leases SET expires_s = {backend.clock_s} WHERE name = ? AND holder = ? "
        "AND epoch = ?",
        (LEADER, term.holder, term.epoch),
    )


def check(db: Db, backend: Backend, term: Term) -> None:
    """The fence: raise NotLeader unless the lease still carries `term`; inside the
    write it guards, whose transaction then keeps the lease from changing hands until
    it commits (`Backend.share_rows`). Expiry is not checked: a term nobody has taken
    over may still write, since no other leader acts."""
    row = db.execute(
        f"SELECT holder, epoch FROM leases WHERE name = ?{backend.share_rows}", (LEADER,)
    ).fetchone()
    if row is None or (row["holder"], int(row["epoch"])) != (term.holder, term.epoch):
        now = "nobody" if row is None else f"{row['holder']} (term {row['epoch']})"
        raise NotLeader(
            f"replica {term.holder}: its term {term.epoch} as leader has ended; the lease "
            f"is held by {now}",
            leader="" if row is None else str(row["holder"]),
        )


def read(db: Db, backend: Backend) -> Lease:
    """The lease now (holder "" if nobody ever held it)."""
    row = db.execute(
        f"SELECT holder, epoch, expires_s, {backend.clock_s} AS now_s FROM leases WHERE name = ?",
        (LEADER,),
    ).fetchone()
    if row is None:
        now = db.execute(f"SELECT {backend.clock_s} AS now_s").fetchone()["now_s"]
        return Lease("", 0, 0.0, float(now))
    return Lease(row["holder"], int(row["epoch"]), float(row["expires_s"]), float(row["now_s"]))
