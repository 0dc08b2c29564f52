"""What a socket's calls return (node_agent/socket.py): a kernel's or collective's run,
an endpoint's passes, and the socket's state, in emulated ns and bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

from rdurack.rack.memory import TierUsage


@dataclass(frozen=True)
class Run:
    """What one kernel or collective call did on this socket, in emulated ns."""

    socket_id: str
    start_ns: int
    end_ns: int
    kernel_calls: int = 0
    hbm_bytes: int = 0
    flops: int = 0  # FLOPs of its kernels on this socket
    launch_ns: int = 0  # of the duration: launching its kernels
    collective_ns: int = 0  # of the duration: collectives inside its kernels nothing hides
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class PassesRun:
    """An endpoint's passes on this socket: each one's emulated duration, and the clock
    before and after them, ns."""

    socket_id: str
    start_ns: int
    end_ns: int
    durations_ns: tuple[int, ...]


@dataclass(frozen=True)
class SocketState:
    socket_id: str
    job_id: str | None
    clock_ns: int
    link_address: str
    slowdown: float
    tiers: dict[str, TierUsage] = field(default_factory=dict)
