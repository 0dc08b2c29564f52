"""A job's spans as a Chrome/Perfetto trace (traces/chrome.py): a process per service,
well-formed events, lanes whose events nest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rdurack.telemetry import names
from rdurack.traces.chrome import to_chrome
from rdurack.traces.spans import Span, read_trace_dir, select_job
from tests.support.traces import OPS, SOCKETS


def test_the_chrome_trace_has_a_process_per_service_and_well_formed_events(
    job_dir: Path,
) -> None:
    spans = select_job(read_trace_dir(job_dir), "job-a")
    doc = json.loads(json.dumps(to_chrome(spans, "job-a")))
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(spans)
    for e in complete:
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0 and e["dur"] >= 0
    named = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(named) == {"rdurack-orchestrator", "rdurack-node-agent-0", *SOCKETS}
    assert len(set(named.values())) == len(named)  # one process per service
    for sid in SOCKETS:  # each socket one lane, its operations only
        mine = [e for e in complete if e["pid"] == named[sid]]
        assert len(mine) == len(OPS) and {e["tid"] for e in mine} == {0}
        assert {e["cat"] for e in mine} == {"hardware"}
    router = next(e for e in complete if e["args"].get(names.ATTR_KERNEL_ROLE) == "router")
    assert router["dur"] == 40_000  # µs
    assert doc["otherData"]["job_id"] == "job-a"


def test_overlapping_spans_of_one_service_get_lanes_that_nest(tmp_path: Path) -> None:
    """Concurrent RPCs of one process overlap without nesting: Chrome's complete events
    of one thread must nest, so they go to different threads."""
    mk = [("a", 0, 100), ("b", 10, 50), ("c", 40, 120), ("d", 60, 70), ("e", 130, 140)]
    spans = [
        Span("1" * 32, f"{i + 1:016x}", None, n, "svc", 1, s * 1000, e * 1000)
        for i, (n, s, e) in enumerate(mk)
    ]
    events = [e for e in to_chrome(spans)["traceEvents"] if e["ph"] == "X"]
    by_tid: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        by_tid.setdefault(e["tid"], []).append(e)
    assert len(by_tid) == 2  # c overlaps a without nesting in it
    for lane in by_tid.values():
        for x in lane:
            for y in lane:
                x0, x1, y0, y1 = x["ts"], x["ts"] + x["dur"], y["ts"], y["ts"] + y["dur"]
                nested = (x0 <= y0 and y1 <= x1) or (y0 <= x0 and x1 <= y1)
                assert nested or x1 <= y0 or y1 <= x0, (x["name"], y["name"])
