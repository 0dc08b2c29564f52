"""A job's spans as Jaeger trace JSON (traces/jaeger.py): what the export holds, and
what its validator finds in documents broken on purpose."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rdurack.telemetry import names
from rdurack.traces.jaeger import CHILD_OF, to_jaeger, validate_jaeger
from rdurack.traces.spans import read_trace_dir, select_job
from tests.support.traces import SOCKETS, WALL0


def test_the_jaeger_json_of_a_job_validates(job_dir: Path) -> None:
    spans = select_job(read_trace_dir(job_dir), "job-a")
    doc = json.loads(json.dumps(to_jaeger(spans)))  # as the file holds it
    assert validate_jaeger(doc) == []
    [t] = doc["data"]
    assert len(t["spans"]) == len(spans)
    services = {p["serviceName"] for p in t["processes"].values()}
    assert services == {"rdurack-orchestrator", "rdurack-node-agent-0", *SOCKETS}
    by_id = {s["spanID"]: s for s in t["spans"]}
    job = next(s for s in t["spans"] if s["operationName"] == names.SPAN_JOB)
    assert job["references"][0]["refType"] == "FOLLOWS_FROM"  # the round, another trace
    kernels = [s for s in t["spans"] if s["operationName"] == names.SPAN_KERNEL]
    for k in kernels:
        [ref] = k["references"]
        assert ref["refType"] == CHILD_OF
        assert by_id[ref["spanID"]]["operationName"] == names.SPAN_NODE_PROGRAM
        tags = {x["key"]: x for x in k["tags"]}
        assert tags[names.ATTR_EMULATED_START_NS]["type"] == "int64"
        assert tags[names.ATTR_SOCKET]["type"] == "string"
    router = next(
        k
        for k in kernels
        if {"key": names.ATTR_KERNEL_ROLE, "type": "string", "value": "router"} in k["tags"]
    )
    assert router["startTime"] == WALL0 // 1000 and router["duration"] == 40_000  # µs
    switch = next(s for s in t["spans"] if s["operationName"] == names.SPAN_EXPERT_SWITCH)
    evicted = {x["key"]: x for x in switch["tags"]}[names.ATTR_EVICTED]
    assert evicted["type"] == "string" and json.loads(evicted["value"]) == []


def _jaeger(job_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        json.dumps(to_jaeger(select_job(read_trace_dir(job_dir), "job-a")))
    )
    return doc


@pytest.mark.parametrize(
    ("break_it", "complaint"),
    [
        (lambda d: d.pop("data"), '"data"'),
        (lambda d: d["data"][0]["spans"][0].pop("processID"), "processID"),
        (lambda d: d["data"][0]["processes"].clear(), "processes"),
        (lambda d: d["data"][0]["spans"][1].update(startTime=1.5), "startTime"),
        (lambda d: d["data"][0]["spans"][1].update(duration=-1), "duration"),
        (lambda d: d["data"][0]["spans"][1].update(duration=True), "duration"),
        (lambda d: d["data"][0]["spans"][1].update(spanID="xyz"), "spanID"),
        (lambda d: d["data"][0]["spans"][1].update(traceID="0" * 32), "traceID"),
        (lambda d: d["data"][0]["spans"][1].update(operationName=""), "operationName"),
        (
            lambda d: d["data"][0]["spans"][2].update(spanID=d["data"][0]["spans"][1]["spanID"]),
            "not unique",
        ),
        (
            lambda d: d["data"][0]["spans"][1]["tags"].append(
                {"key": "k", "type": "int64", "value": "7"}
            ),
            "int64",
        ),
        (
            lambda d: d["data"][0]["spans"][1]["tags"].append(
                {"key": "k", "type": "list", "value": []}
            ),
            "type",
        ),
        (
            lambda d: d["data"][0]["spans"][1]["references"].append(
                {"refType": "PARENT", "traceID": "0" * 32, "spanID": "0" * 16}
            ),
            "refType",
        ),
        (
            lambda d: d["data"][0]["spans"][1]["references"].append(
                {"refType": CHILD_OF, "traceID": d["data"][0]["traceID"], "spanID": "f" * 16}
            ),
            "not in the trace",
        ),
        (lambda d: d["data"][0]["spans"][1]["logs"].append({"timestamp": "now"}), "logs"),
    ],
)
def test_the_validator_finds_what_breaks_the_format(
    job_dir: Path, break_it: Any, complaint: str
) -> None:
    doc = _jaeger(job_dir)
    doc["data"][0]["spans"].sort(key=lambda s: s["startTime"])  # the job span first
    broken = copy.deepcopy(doc)
    break_it(broken)
    problems = validate_jaeger(broken)
    assert problems, "the validator accepted a broken document"
    assert any(complaint in p for p in problems), problems
    assert validate_jaeger(doc) == []


def test_a_lost_parent_is_a_problem_unless_allowed(job_dir: Path) -> None:
    spans = select_job(read_trace_dir(job_dir), "job-a")
    without_node = [s for s in spans if s.name != names.SPAN_NODE_PROGRAM]
    doc = to_jaeger(without_node)
    assert any("not in the trace" in p for p in validate_jaeger(doc))
    assert validate_jaeger(doc, allow_missing_parents=True) == []
    orphan = next(s for s in doc["data"][0]["spans"] if s["operationName"] == names.SPAN_KERNEL)
    assert "not in the trace files" in orphan["warnings"][0]
