"""The one place that turns the plain Socket class into a Ray actor.

num_cpus=0: sixteen sockets share the host's cores; each actor is mostly waiting on its
links. One call runs at a time, so a socket's state needs no locks; its gRPC link
server runs on its own threads and only touches the thread-safe mailbox.

The exception is the CONTROL concurrency group, one more thread: the calls that must
answer while the socket is busy with a long call (a training segment). Its methods
(CONTROL_METHODS) only read attributes or touch lock-protected link state and the
mailbox: a heartbeat, aborting a job's waits, fault hooks, learning peer addresses.
Callers pick it per call: `actor.heartbeat.options(concurrency_group=CONTROL)`.

Each actor is its own process: it configures tracing on construction, with its socket
id as service.name (one Jaeger lane per socket).
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from rdurack.node_agent import heap
from rdurack.node_agent.socket import Socket
from rdurack.telemetry import setup


class TracedSocket(Socket):
    """A Socket in its own actor process, which it configures tracing for."""

    def __init__(self, socket_id: str, *args: Any, **kwargs: Any) -> None:
        heap.keep_freed_buffers()  # the process is this socket's: its links' buffers
        setup.configure(socket_id, env_name_wins=False)
        super().__init__(socket_id, *args, **kwargs)

    def flush_traces(self, timeout_ms: int = 5000) -> bool:
        """Export queued spans now (the agent calls it before killing the actor, which
        runs no exit handlers)."""
        return setup.flush(timeout_ms)


CONTROL = "control"
CONTROL_METHODS = frozenset(
    {"heartbeat", "abort", "slow", "set_link_down", "set_link_delay", "connect"}
)
# max_restarts=0: a dead actor stays dead until its agent restarts it (docs/faults.md).
# Ray's typing stubs do not list concurrency_groups, which ray.remote accepts.
_remote: Any = ray.remote
SocketActor: Any = _remote(num_cpus=0, max_restarts=0, concurrency_groups={CONTROL: 1})(
    TracedSocket
)


def control(actor: Any, method: str) -> Any:
    """`actor.method` on the CONTROL thread (it answers while the socket is busy)."""
    if method not in CONTROL_METHODS:
        raise ValueError(f"{method} is not a control method: {sorted(CONTROL_METHODS)}")
    return getattr(actor, method).options(concurrency_group=CONTROL)


def start_ray(address: str | None = None) -> None:
    """Join the Ray cluster at `address`, or start a local one. Its processes stay on
    loopback because importing rdurack set Ray's environment (rdurack/__init__.py)."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace="rdurack", logging_level=logging.WARNING)
    else:
        ray.init(
            # "local": always a new cluster. Without it Ray joins whatever cluster
            # /tmp/ray/ray_current_cluster names (a user's `ray start`, or a dead one).
            address="local",
            namespace="rdurack",
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
