"""Rack metrics (telemetry/metrics.py, api/metrics.py): the gauges read a
source passed in, one sample per collection, and a Prometheus endpoint serves them."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from rdurack.api import metrics as rack_metrics
from rdurack.orchestrator.gateway import NodeView, SocketView, TierView
from rdurack.orchestrator.jobs import Job, JobState
from rdurack.telemetry import names
from rdurack.telemetry.metrics import (
    ATTR_JOB_STATE,
    JOB_STATES,
    CachedSource,
    RackSample,
    SocketSample,
    register_rack_metrics,
    serve_prometheus,
)

GB = 10**9
SAMPLE = RackSample(
    sockets=(
        SocketSample(
            "rdu-n0-s0",
            0,
            busy=True,
            healthy=True,
            hbm_used_bytes=16 * GB,
            hbm_capacity_bytes=64 * GB,
        ),
        SocketSample(
            "rdu-n1-s3", 1, busy=False, healthy=False, hbm_used_bytes=0, hbm_capacity_bytes=64 * GB
        ),
    ),
    queued=3,
    jobs_by_state={"PENDING": 3, "RUNNING": 1, "SUCCEEDED": 7},
)


class Counting:
    def __init__(self, sample: RackSample) -> None:
        self.value = sample
        self.calls = 0

    def sample(self) -> RackSample:
        self.calls += 1
        return self.value


def collect(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """metric name -> [(attributes, value)] of one collection."""
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = [(dict(p.attributes or {}), p.value) for p in m.data.data_points]  # type: ignore[union-attr]
    return out


def test_the_gauges_report_the_sample() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    source = Counting(SAMPLE)
    register_rack_metrics(provider, CachedSource(source.sample, ttl_s=60))
    got = collect(reader)
    s0 = {names.ATTR_SOCKET: "rdu-n0-s0", names.ATTR_NODE: 0}
    s1 = {names.ATTR_SOCKET: "rdu-n1-s3", names.ATTR_NODE: 1}
    assert sorted(got["rdurack.socket.utilization"], key=str) == sorted(
        [(s0, 1.0), (s1, 0.0)], key=str
    )
    assert dict((a[names.ATTR_SOCKET], v) for a, v in got["rdurack.socket.hbm.used"]) == {
        "rdu-n0-s0": 16 * GB,
        "rdu-n1-s3": 0,
    }
    assert dict((a[names.ATTR_SOCKET], v) for a, v in got["rdurack.socket.hbm.utilization"]) == {
        "rdu-n0-s0": 0.25,
        "rdu-n1-s3": 0.0,
    }
    assert dict((a[names.ATTR_SOCKET], v) for a, v in got["rdurack.socket.healthy"]) == {
        "rdu-n0-s0": 1.0,
        "rdu-n1-s3": 0.0,
    }
    assert got["rdurack.jobs.queued"] == [({}, 3)]
    by_state = {a[ATTR_JOB_STATE]: v for a, v in got["rdurack.jobs"]}
    assert by_state == {s: SAMPLE.jobs_by_state.get(s, 0) for s in JOB_STATES}
    assert source.calls == 1  # one sample served every gauge of the collection
    provider.shutdown()


def test_a_cached_sample_is_renewed_after_its_ttl() -> None:
    now = [0.0]
    source = Counting(SAMPLE)
    cached = CachedSource(source.sample, ttl_s=1.0, clock=lambda: now[0])
    cached.sample()
    now[0] = 0.5
    cached.sample()
    assert source.calls == 1
    now[0] = 1.5
    cached.sample()
    assert source.calls == 2


class FakeOrchestrator:
    def rack(self) -> list[NodeView]:
        hbm = {"hbm": TierView(used_bytes=8 * GB, peak_bytes=8 * GB, capacity_bytes=64 * GB)}
        return [
            NodeView(
                0,
                "127.0.0.1:1",
                True,
                (
                    SocketView("rdu-n0-s0", 0, True, job_id="j1", tiers=hbm),
                    SocketView("rdu-n0-s1", 0, True),
                ),
            ),
            NodeView(1, "127.0.0.1:2", False, error="unreachable"),
        ]

    def jobs(self, states: Sequence[JobState] | None = None) -> list[Job]:
        class J:
            def __init__(self, state: JobState) -> None:
                self.state = state

        states_ = [JobState.PENDING, JobState.PENDING, JobState.RUNNING, JobState.FAILED]
        return [J(s) for s in states_]  # type: ignore[misc]


def test_the_orchestrator_source_reads_the_rack_and_the_jobs() -> None:
    sample = rack_metrics.sample(FakeOrchestrator())
    assert [
        (s.socket_id, s.busy, s.hbm_used_bytes, s.hbm_capacity_bytes) for s in sample.sockets
    ] == [
        ("rdu-n0-s0", True, 8 * GB, 64 * GB),
        ("rdu-n0-s1", False, 0, 0),
    ]
    assert sample.queued == 2
    assert sample.jobs_by_state == {"PENDING": 2, "RUNNING": 1, "FAILED": 1}


def test_prometheus_serves_the_gauges_on_loopback() -> None:
    endpoint = serve_prometheus(CachedSource(lambda: SAMPLE), "127.0.0.1", 0)
    try:
        assert endpoint.port > 0
        with urllib.request.urlopen(endpoint.url, timeout=10) as r:
            text = r.read().decode()
    finally:
        endpoint.shutdown()
    assert "rdurack_socket_utilization{" in text
    assert 'rdurack_socket_id="rdu-n0-s0"' in text
    assert "rdurack_socket_hbm_used_bytes{" in text
    assert "rdurack_jobs{" in text and 'rdurack_job_state="PENDING"} 3.0' in text
    line = next(x for x in text.splitlines() if x.startswith("rdurack_jobs_queued{"))
    assert line.endswith(" 3.0")
