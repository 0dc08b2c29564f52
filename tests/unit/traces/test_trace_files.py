"""Trace files (telemetry/file_export.py) read back (traces/spans.py): the exporter's
round trip, torn lines, the processors that write the files, a job's selection among
the spans of a trace dir, and the names docs/tracing.md documents.

Spans are written by real TracerProviders (one per service, as each process has its
own) through the real exporter; no test touches the global provider.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import Link, Status, StatusCode

from rdurack.telemetry import names, setup
from rdurack.telemetry.file_export import JsonlSpanExporter, file_name
from rdurack.traces.jaeger import to_jaeger, validate_jaeger
from rdurack.traces.spans import read_trace_dir, select_job
from tests.support.traces import OPS, SOCKETS, Services

# ------------------------------------------------------------------ the exporter


def test_a_span_round_trips_through_a_trace_file(tmp_path: Path) -> None:
    provider = TracerProvider(resource=Resource.create({names.SERVICE_NAME: "rdu-n1-s7"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(tmp_path, "rdu-n1-s7")))
    tracer = provider.get_tracer("rdurack.socket")
    with tracer.start_as_current_span("other") as other:
        pass
    with tracer.start_as_current_span("parent") as parent:
        child = tracer.start_span(
            "rdu.kernel",
            links=[Link(other.get_span_context(), {"why": "test"})],
            start_time=123_456_789,
            attributes={"s": "x", "i": 7, "f": 0.5, "b": True, "l": ["a", "b"], "n": [1, 2]},
        )
        child.add_event("switched", {"bytes": 10}, timestamp=123_456_999)
        child.set_status(Status(StatusCode.ERROR, "it broke"))
        child.end(end_time=223_456_789)
    provider.shutdown()

    [path] = list(tmp_path.iterdir())
    assert path.name == f"rdu-n1-s7-{os.getpid()}.jsonl"
    spans = {s.name: s for s in read_trace_dir(tmp_path).spans}
    got = spans["rdu.kernel"]
    ctx = child.get_span_context()
    assert got.trace_id == f"{ctx.trace_id:032x}" and got.span_id == f"{ctx.span_id:016x}"
    assert got.parent_id == f"{parent.get_span_context().span_id:016x}"
    assert spans["parent"].parent_id is None
    assert (got.start_ns, got.end_ns) == (123_456_789, 223_456_789)
    assert (got.service, got.pid, got.scope) == ("rdu-n1-s7", os.getpid(), "rdurack.socket")
    assert got.attributes == {"s": "x", "i": 7, "f": 0.5, "b": True, "l": ["a", "b"], "n": [1, 2]}
    assert (got.status_code, got.status_description) == ("ERROR", "it broke")
    [link] = got.links
    assert link.span_id == spans["other"].span_id and link.attributes == {"why": "test"}
    assert got.events[0]["name"] == "switched" and got.events[0]["time_ns"] == 123_456_999


def test_each_batch_is_on_disk_when_export_returns(tmp_path: Path) -> None:
    """No buffering between export and the file: a process killed right after (a socket
    actor that Ray kills) has lost nothing it exported."""
    exporter = JsonlSpanExporter(tmp_path, "rdu-n0-s0")
    provider = TracerProvider(resource=Resource.create({names.SERVICE_NAME: "rdu-n0-s0"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("one").end()
    lines = exporter.path.read_text().splitlines()  # read while the file is still open
    assert len(lines) == 1 and json.loads(lines[0])["name"] == "one"
    provider.shutdown()


def test_a_forked_process_writes_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = JsonlSpanExporter(tmp_path, "rdurack-orchestrator")
    provider = TracerProvider(resource=Resource.create({names.SERVICE_NAME: "x"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("parent's").end()
    mine = tmp_path / file_name("rdurack-orchestrator", os.getpid())
    monkeypatch.setattr(os, "getpid", lambda: 999_999)  # as after a fork
    provider.get_tracer("t").start_span("child's").end()
    provider.shutdown()
    theirs = tmp_path / "rdurack-orchestrator-999999.jsonl"
    assert [json.loads(x)["name"] for x in mine.read_text().splitlines()] == ["parent's"]
    assert [json.loads(x)["name"] for x in theirs.read_text().splitlines()] == ["child's"]


def test_a_service_name_is_made_safe_for_a_file_name() -> None:
    assert file_name("rdu-n0-s3", 12) == "rdu-n0-s3-12.jsonl"
    assert file_name("a/b c", 1) == "a_b_c-1.jsonl"
    assert file_name("", 1) == "unknown-1.jsonl"


def test_a_torn_last_line_is_skipped_and_counted(job_dir: Path) -> None:
    whole = read_trace_dir(job_dir)
    victim = next(job_dir.glob("rdu-n0-s1-*.jsonl"))
    with victim.open("a") as f:
        f.write('{"trace_id": "ab12", "span_id": "cd')  # a crash while writing
    torn = read_trace_dir(job_dir)
    assert torn.bad_lines == 1 and whole.bad_lines == 0
    assert len(torn.spans) == len(whole.spans)


def test_processors_add_a_trace_file_exporter_when_the_trace_dir_is_set(tmp_path: Path) -> None:
    assert setup.processors({}) == []
    [bsp] = setup.processors({"RDURACK_TRACE_DIR": str(tmp_path)}, service_name="rdu-n0-s2")
    assert isinstance(bsp, BatchSpanProcessor)
    exporter = bsp._batch_processor._exporter
    assert isinstance(exporter, JsonlSpanExporter)
    assert (exporter.directory, exporter.service) == (tmp_path, "rdu-n0-s2")
    assert bsp._batch_processor._max_queue_size == setup.MAX_QUEUE_SIZE
    both = setup.processors(
        {"RDURACK_TRACE_DIR": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert len(both) == 2
    for p in [bsp, *both]:
        p.shutdown()


def test_configure_writes_the_processs_spans_and_flushes_them_at_shutdown(
    tmp_path: Path,
) -> None:
    code = (
        "from rdurack.telemetry import setup\n"
        "p = setup.configure('rdurack-orchestrator')\n"
        "for i in range(3):\n"
        "    p.get_tracer('t').start_span(f's{i}').end()\n"
        "setup.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "RDURACK_TRACE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [path] = list(tmp_path.iterdir())
    assert path.name.startswith("rdurack-orchestrator-")
    assert sorted(s.name for s in read_trace_dir(tmp_path).spans) == ["s0", "s1", "s2"]


# ------------------------------------------------------------------ one job's spans


def test_a_jobs_spans_are_its_trace_and_not_the_other_jobs(job_dir: Path) -> None:
    traces = read_trace_dir(job_dir)
    assert traces.files == 4  # orchestrator, agent, two sockets
    assert set(traces.job_ids()) == {"job-a", "job-b"}
    spans = select_job(traces, "job-b")
    [job] = [s for s in spans if s.name == names.SPAN_JOB]
    assert job.job_id == "job-b"
    assert {s.trace_id for s in spans} == {job.trace_id}
    # The job span's whole trace: RPCs, the agent's span, every socket operation.
    assert len(spans) == 1 + 2 + 1 + len(SOCKETS) * len(OPS)
    assert all(s.job_id in (None, "job-b") for s in spans)
    # The round is in its own trace today (linked, not a parent): not selected.
    assert not [s for s in spans if s.name == names.SPAN_SCHEDULE]


def test_when_a_round_is_the_parent_of_two_jobs_each_keeps_its_own_branch(
    services: Services,
) -> None:
    """With /tmp/issue7-orchestrator.patch the round is each job's parent: jobs placed
    by one round share its trace, and a job's selection leaves the other job out."""
    orch = services.tracer("rdurack-orchestrator")
    with orch.start_as_current_span(names.SPAN_SCHEDULE) as round_span:
        for job_id in ("job-a", "job-b"):
            with (
                orch.start_as_current_span(names.SPAN_JOB, attributes={names.ATTR_JOB_ID: job_id}),
                orch.start_as_current_span("rdurack.v1.NodeAgentService/RunKernel"),
            ):
                pass
    spans = select_job(read_trace_dir(services.directory), "job-a")
    assert sorted(s.name for s in spans) == sorted(
        [names.SPAN_SCHEDULE, names.SPAN_JOB, "rdurack.v1.NodeAgentService/RunKernel"]
    )
    assert {s.trace_id for s in spans} == {f"{round_span.get_span_context().trace_id:032x}"}
    assert validate_jaeger(to_jaeger(spans)) == []


def test_every_span_and_attribute_name_is_documented() -> None:
    """docs/tracing.md names every constant of telemetry/names.py, and its value."""
    doc = (Path(__file__).parents[3] / "docs" / "tracing.md").read_text()
    constants = {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    assert len(constants) > 40
    missing = [f"{k} = {v!r}" for k, v in constants.items() if f"`{v}`" not in doc]
    assert not missing, missing
    undocumented = [
        k for k in constants if k.startswith(("SPAN_", "ATTR_")) and f"`{k}`" not in doc
    ]
    assert not undocumented, undocumented
    # Every row of the span and attribute tables pairs a value with its own constant,
    # and names no constant that is gone.
    rows = re.findall(r"^\| `([^`]+)` \| `([A-Z_]+)` \|", doc, re.M)
    assert len(rows) > 40
    assert [(v, k) for v, k in rows if constants.get(k) != v] == []
