"""Fixtures of the unit tests: an in-memory span exporter for tests of tracing; the fake
gateway, a clock the test advances, and an orchestrator on them that the test steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.orchestrator.orchestrator import Orchestrator
from tests.support.fake_rack import FakeClock, FakeGateway, stepped


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A TracerProvider of the test's own (never the global one), exporting each span
    to memory as it ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def gateway() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def orch(tmp_path: Path, gateway: FakeGateway, clock: FakeClock) -> Iterator[Orchestrator]:
    """An orchestrator on the fake gateway and clock, started without its scheduling and
    health threads: the test runs each round (schedule_once, supervise_once)."""
    with stepped(tmp_path / "jobs.sqlite", gateway, poll_s=0.05, clock=clock) as o:
        yield o
