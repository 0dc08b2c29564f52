"""The transfer rule every link follows, in integer nanoseconds of emulated time.

    start   = max(sender clock, link free)
    arrival = start + latency + bytes / bandwidth
    link free becomes start + bytes / bandwidth   (the link is busy while it serialises)

The link's busy time models contention: a second transfer on a busy link waits. Latency
is charged once per transfer, whatever the chunking on the wire. Both the predictor
(simulating a collective's schedule) and the socket actors (sending real bytes over
gRPC) use this one rule, so they give the same emulated times.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from rdurack.errors import InvalidRequest
from rdurack.rack.clock import seconds_to_ns
from rdurack.rack.spec import LinkSpec


@dataclass(frozen=True, slots=True)
class Route:
    """What a transfer crosses: a direct link, or (no direct link) a rail then a mesh hop,
    priced as one virtual link with the latencies added and the slowest bandwidth."""

    latency_ns: float
    bandwidth_bytes_per_s: float

    @classmethod
    def over(cls, links: list[LinkSpec]) -> Route:
        if not links:
            raise InvalidRequest("a transfer needs at least one link")
        return cls(
            latency_ns=sum(link.latency_ns for link in links),
            bandwidth_bytes_per_s=min(link.bandwidth_bytes_per_s for link in links),
        )

    def serialise_ns(self, nbytes: float) -> int:
        return seconds_to_ns(nbytes / self.bandwidth_bytes_per_s)


class LinkState:
    """One direction of one link (or one socket's switch port) with its busy time."""

    def __init__(self, route: Route, slowdown: float = 1.0) -> None:
        self.route = route
        self.free_ns = 0
        self.bytes_sent = 0
        self.slowdown = slowdown  # a fault hook: a degraded link is this many times slower

    def transmit(self, send_ns: int, nbytes: float) -> tuple[int, int]:
        """Send `nbytes` when the sender's clock reads `send_ns`: (start, arrival) in ns."""
        if nbytes < 0:
            raise InvalidRequest(f"cannot send {nbytes} bytes")
        start = max(send_ns, self.free_ns)
        busy = self.route.serialise_ns(nbytes * self.slowdown)
        self.free_ns = start + busy
        self.bytes_sent += int(nbytes)
        return start, start + ceil(self.route.latency_ns * self.slowdown) + busy
