"""Rack metrics through the OpenTelemetry metrics API, exportable to Prometheus.

Observable gauges, read when a reader collects (a Prometheus scrape): each one's
callback asks a *source* for one `RackSample`. The source is a plain object passed in
(api/metrics.py adapts the orchestrator), so nothing here is a module-level
singleton and tests give their own source and reader. One sample serves all gauges of
one collection (`CachedSource`): a scrape costs one look at the rack, not one per gauge.

- `rdurack.socket.utilization` (1; socket, node): 1 while a job holds the socket, else
  0. Averaged over time (PromQL `avg_over_time`) it is the share of time allocated.
- `rdurack.socket.hbm.used` (By; socket, node): HBM bytes allocated on the socket.
- `rdurack.socket.hbm.utilization` (1; socket, node): HBM used / HBM capacity.
- `rdurack.socket.healthy` (1; socket, node): 1 when its actor answers, else 0.
- `rdurack.jobs.queued` ({job}): jobs PENDING, waiting for sockets.
- `rdurack.jobs` ({job}; `rdurack.job.state`): jobs in each state, 0s included.

Socket attributes are `rdurack.socket.id` and `rdurack.node.index`. In Prometheus the
dots become underscores and a byte unit is appended: `rdurack_socket_hbm_used_bytes`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, MeterProvider, ObservableGauge, Observation

from rdurack.telemetry import names

METER = "rdurack.rack"
# Every job state, so a state with no job still reports 0 (a Prometheus series that
# disappears reads as "no data", not as zero).
JOB_STATES = ("PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
ATTR_JOB_STATE = "rdurack.job.state"


@dataclass(frozen=True)
class SocketSample:
    socket_id: str
    node: int
    busy: bool  # a job holds it
    healthy: bool
    hbm_used_bytes: int
    hbm_capacity_bytes: int


@dataclass(frozen=True)
class RackSample:
    """The rack at one instant, as the gauges report it."""

    sockets: tuple[SocketSample, ...] = ()
    queued: int = 0
    jobs_by_state: Mapping[str, int] = field(default_factory=dict)


class RackSource(Protocol):
    def sample(self) -> RackSample:
        """The rack now. May raise: the gauges then report nothing this collection."""
        ...


class CachedSource:
    """A source that asks `sample` at most once per `ttl_s` seconds: the gauges of one
    collection (called one after another) share one sample."""

    def __init__(
        self,
        sample: Callable[[], RackSample],
        ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sample = sample
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[float, RackSample] | None = None

    def sample(self) -> RackSample:
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._last[0] >= self._ttl_s:
                self._last = (now, self._sample())
            return self._last[1]


def _socket_attributes(s: SocketSample) -> dict[str, str | int]:
    return {names.ATTR_SOCKET: s.socket_id, names.ATTR_NODE: s.node}


def register_rack_metrics(provider: MeterProvider, source: RackSource) -> list[ObservableGauge]:
    """Create the rack's gauges on `provider`'s meter, reading `source` when collected."""
    meter = provider.get_meter(METER)

    def per_socket(value: Callable[[SocketSample], float]) -> Callable[..., Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value(s), _socket_attributes(s)) for s in source.sample().sockets]

        return callback

    def queued(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(source.sample().queued)]

    def jobs(options: CallbackOptions) -> Iterable[Observation]:
        counts = source.sample().jobs_by_state
        states = list(JOB_STATES) + sorted(set(counts) - set(JOB_STATES))
        return [Observation(counts.get(s, 0), {ATTR_JOB_STATE: s}) for s in states]

    return [
        meter.create_observable_gauge(
            "rdurack.socket.utilization",
            [per_socket(lambda s: 1.0 if s.busy else 0.0)],
            unit="1",
            description="1 while a job holds the socket, else 0 (average it over time)",
        ),
        meter.create_observable_gauge(
            "rdurack.socket.hbm.used",
            [per_socket(lambda s: s.hbm_used_bytes)],
            unit="By",
            description="HBM bytes allocated on the socket",
        ),
        meter.create_observable_gauge(
            "rdurack.socket.hbm.utilization",
            [
                per_socket(
                    lambda s: (
                        s.hbm_used_bytes / s.hbm_capacity_bytes if s.hbm_capacity_bytes else 0.0
                    )
                )
            ],
            unit="1",
            description="HBM used / HBM capacity of the socket",
        ),
        meter.create_observable_gauge(
            "rdurack.socket.healthy",
            [per_socket(lambda s: 1.0 if s.healthy else 0.0)],
            unit="1",
            description="1 when the socket's actor answers, else 0",
        ),
        meter.create_observable_gauge(
            "rdurack.jobs.queued",
            [queued],
            unit="{job}",
            description="jobs PENDING, waiting for sockets",
        ),
        meter.create_observable_gauge(
            "rdurack.jobs",
            [jobs],
            unit="{job}",
            description="jobs in each state",
        ),
    ]


@dataclass
class PrometheusEndpoint:
    """A `/metrics` HTTP endpoint in Prometheus text format, and how to stop it."""

    host: str
    port: int
    provider: MeterProvider
    _stop: Callable[[], None]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def shutdown(self) -> None:
        self._stop()


def serve_prometheus(
    source: RackSource, host: str = "127.0.0.1", port: int = 0, service_name: str = "rdurack"
) -> PrometheusEndpoint:
    """Serve the rack's gauges for Prometheus on `host:port` (0: a free port), with a
    meter provider and a registry of their own (not prometheus_client's global one)."""
    # Imported here: only a process that serves metrics needs the exporter.
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = SdkMeterProvider(
        metric_readers=[reader], resource=Resource.create({names.SERVICE_NAME: service_name})
    )
    register_rack_metrics(provider, source)
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        provider.shutdown()

    return PrometheusEndpoint(host, int(server.server_port), provider, stop)
