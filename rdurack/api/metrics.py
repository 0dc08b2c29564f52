"""The orchestrator as a source of rack metrics (telemetry/metrics.py), and a Prometheus
endpoint for it. The orchestrator's process serves it when given a metrics port (the
hook is in orchestrator_main; see docs/tracing.md, "Metrics")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from rdurack.orchestrator.gateway import NodeView
from rdurack.orchestrator.jobs import Job, JobState
from rdurack.telemetry.metrics import (
    CachedSource,
    PrometheusEndpoint,
    RackSample,
    SocketSample,
    serve_prometheus,
)

# A scrape every few seconds must not turn into a fan-out to every actor each time it
# reads one gauge: one look at the rack serves every gauge of a scrape.
SAMPLE_TTL_S = 1.0


class RackView(Protocol):
    """What the metrics read of an Orchestrator (its public API)."""

    def rack(self) -> list[NodeView]: ...

    def jobs(self, states: Sequence[JobState] | None = None) -> list[Job]: ...


def sample(orchestrator: RackView) -> RackSample:
    """The rack now: every socket the node agents report, and the jobs by state."""
    sockets = []
    for node in orchestrator.rack():
        for s in node.sockets:
            hbm = s.tiers.get("hbm")
            sockets.append(
                SocketSample(
                    socket_id=s.socket_id,
                    node=s.node,
                    busy=bool(s.job_id),
                    healthy=s.healthy,
                    hbm_used_bytes=hbm.used_bytes if hbm else 0,
                    hbm_capacity_bytes=hbm.capacity_bytes if hbm else 0,
                )
            )
    counts = Counter(str(j.state.value) for j in orchestrator.jobs())
    return RackSample(tuple(sockets), counts.get(JobState.PENDING.value, 0), dict(counts))


def orchestrator_source(orchestrator: RackView, ttl_s: float = SAMPLE_TTL_S) -> CachedSource:
    return CachedSource(lambda: sample(orchestrator), ttl_s)


def serve(orchestrator: RackView, host: str = "127.0.0.1", port: int = 0) -> PrometheusEndpoint:
    """`/metrics` for Prometheus on host:port (0: a free one); `.shutdown()` stops it."""
    return serve_prometheus(
        orchestrator_source(orchestrator), host, port, service_name="rdurack-orchestrator"
    )
