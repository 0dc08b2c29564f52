"""The errors rdurack raises on purpose, in every room: each says what went wrong, with
the numbers."""

from __future__ import annotations

import re


class RdurackError(Exception):
    """Base of every error rdurack raises on purpose (never a bare traceback)."""


class OutOfMemory(RdurackError):
    """An allocation does not fit in a tier."""

    def __init__(self, socket: str, tier: str, asked_bytes: int, free_bytes: int, what: str = ""):
        self.socket = socket
        self.tier = tier
        self.asked_bytes = asked_bytes
        self.free_bytes = free_bytes
        label = f" for {what}" if what else ""
        self.what = what
        super().__init__(
            f"{socket}: {tier.upper()} cannot hold {asked_bytes:,} bytes{label}: "
            f"{free_bytes:,} bytes free"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, int, int, str]]:
        # Errors cross process boundaries (Ray actors): rebuild from the fields.
        return (type(self), (self.socket, self.tier, self.asked_bytes, self.free_bytes, self.what))

    @classmethod
    def from_message(cls, message: str) -> OutOfMemory | None:
        """Rebuild one from its message (how it crosses gRPC, as status details);
        None if `message` is not one."""
        m = _OOM.fullmatch(message)
        if m is None:
            return None
        asked, free = (int(m[k].replace(",", "")) for k in ("asked", "free"))
        return cls(m["socket"], m["tier"].lower(), asked, free, m["what"] or "")


_OOM = re.compile(
    r"(?P<socket>.+?): (?P<tier>[A-Z]+) cannot hold (?P<asked>[\d,]+) bytes"
    r"(?: for (?P<what>.*))?: (?P<free>[\d,]+) bytes free",
    re.DOTALL,
)


class UnknownName(RdurackError, KeyError):
    """A platform, model, allocation or expert name that does not exist."""

    def __init__(self, kind: str, name: str, accepted: list[str] | None = None):
        self.kind = kind
        self.name = name
        self.accepted = accepted or []
        hint = f"; accepted: {', '.join(self.accepted)}" if self.accepted else ""
        super().__init__(f"unknown {kind} {name!r}{hint}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])

    def __reduce__(self) -> tuple[type, tuple[str, str, list[str]]]:
        return (type(self), (self.kind, self.name, self.accepted))


class InvalidRequest(RdurackError, ValueError):
    """A request that is well-formed but impossible (zero sockets, more sockets than exist)."""


class SocketBusy(RdurackError):
    """A socket serves one job at a time; another job asked for it."""

    def __init__(self, socket: str, holder: str, asked_by: str):
        self.socket, self.holder, self.asked_by = socket, holder, asked_by
        super().__init__(
            f"{socket} is held by job {holder!r}; job {asked_by!r} cannot use it: a socket "
            "serves one job at a time (two processes on one RDU contend in ways its "
            "dataflow engine cannot resolve)"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.socket, self.holder, self.asked_by))


class LinkFailure(RdurackError):
    """A link is down, a peer does not answer, or an expected message never came."""


class StoreUnavailable(RdurackError):
    """The job store's server did not answer, or the connection to it broke (PostgreSQL):
    the request may be retried; a submission with a client_request_id is not doubled."""


class NotLeader(RdurackError):
    """Only the leading orchestrator replica may do this (schedule, run an endpoint's
    passes), or a replica's term as leader ended. `leader`: the replica that holds the
    lease (its address), "" if none does."""

    def __init__(self, message: str, leader: str = ""):
        self.leader = leader
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (str(self), self.leader))


class OneProcessPerSocket(RdurackError):
    """A spec that would run two processes (TP or DDP ranks) on one socket. Refused
    before it runs: an RDU serves one process at a time."""


class PermissionDenied(RdurackError):
    """The caller may not do this: another tenant's job, or an admin's operation."""


class QuotaExceeded(RdurackError):
    """A tenant asked for more sockets than its quota allows."""

    def __init__(self, tenant: str, asked: int, quota: int, in_use: int = 0):
        self.tenant, self.asked, self.quota, self.in_use = tenant, asked, quota, in_use
        super().__init__(
            f"tenant {tenant!r}: a job of {asked} sockets exceeds its socket quota of "
            f"{quota} (in use: {in_use})"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int, int]]:
        return (type(self), (self.tenant, self.asked, self.quota, self.in_use))
