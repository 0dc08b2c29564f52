"""What a DDP rank needs of the socket it runs on (node_agent/socket.py is one).

A protocol, so that the rank imports nothing of the socket (the socket imports the rank,
lazily, where a job trains).
"""

from __future__ import annotations

from typing import Protocol

from rdurack.node_agent.collective_engine import CollectiveEngine
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.memory import TieredMemory
from rdurack.rack.spec import PlatformSpec


class RankHost(Protocol):
    """A socket as its training rank sees it."""

    name: str  # the socket's id, the rank's device
    platform: PlatformSpec
    memory: TieredMemory  # the socket's tiers
    clock: EmulatedClock  # the socket's clock: the rank's compute stream
    slowdown: float  # fault hook: its compute takes this many times longer (read live)
    engine: CollectiveEngine  # the socket's collectives over its links

    def address(self) -> str:
        """The socket's link address, host:port (a script job's rendezvous host)."""
        ...
