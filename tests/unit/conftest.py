"""Fixtures of the unit tests: an in-memory span exporter for tests of tracing; the fake
gateway and an orchestrator on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from tests.support.fake_rack import RACK, FakeGateway


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
def orch(tmp_path: Path, gateway: FakeGateway) -> Iterator[Orchestrator]:
    """An orchestrator on the fake gateway, its scheduling thread running."""
    o = Orchestrator(JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, poll_s=0.05)
    o.start()
    yield o
    o.stop()
    o.store.close()
