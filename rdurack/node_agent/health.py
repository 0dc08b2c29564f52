"""What a node agent reports about each of its sockets: SocketHealth.

Kept apart from the agent, which drives Ray, so that the processes that only convert
or display these reports (the gRPC edge, the orchestrator's side of it) do not import
Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdurack.node_agent.runs import SocketState


@dataclass(frozen=True)
class SocketHealth:
    """One socket's liveness as its agent saw it last."""

    socket_id: str
    healthy: bool  # its actor answered
    state: SocketState | None  # None when the actor does not answer
    error: str = ""
    dead: bool = False  # its actor died (not merely slow to answer)
    incarnation: int = 0  # grows by one each time the agent restarts the actor
