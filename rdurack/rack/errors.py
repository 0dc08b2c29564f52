"""Errors of the hardware model. Each one says what went wrong with the numbers."""

from __future__ import annotations


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
        super().__init__(
            f"{socket}: {tier.upper()} cannot hold {asked_bytes:,} bytes{label}: "
            f"{free_bytes:,} bytes free"
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


class InvalidRequest(RdurackError, ValueError):
    """A request that is well-formed but impossible (zero sockets, more sockets than exist)."""
