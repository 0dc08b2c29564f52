"""A job's spans as a Chrome trace, which chrome://tracing and ui.perfetto.dev open.

One process per service (so each socket is its own lane), complete ("X") events with
ts and dur in µs from the first span, metadata ("M") events naming processes and
threads. Times are the spans' wall stamps, as in the Jaeger JSON (spans.py: the two
clocks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rdurack.telemetry import names
from rdurack.traces.spans import Span


def _service_order(service: str) -> tuple[int, str, int, int]:
    """Orchestrator, node agents, then sockets by node and index."""
    m = re.match(r"^rdu-n(\d+)-s(\d+)$", service)
    if m:
        return (2, "", int(m.group(1)), int(m.group(2)))
    return (0 if "orchestrator" in service else 1, service, 0, 0)


def _lanes(spans: Sequence[Span]) -> list[int]:
    """A lane (thread id) for each span such that the spans of one lane either nest or
    do not overlap, as Chrome's complete events must; concurrent calls get more lanes."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start_ns, -spans[i].end_ns))
    stacks: list[list[int]] = []  # per lane: end times of the open spans
    lane_of = [0] * len(spans)
    for i in order:
        s = spans[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            if not stack or s.end_ns <= stack[-1]:
                stack.append(s.end_ns)
                lane_of[i] = lane
                break
        else:
            stacks.append([s.end_ns])
            lane_of[i] = len(stacks) - 1
    return lane_of


def _category(s: Span) -> str:
    if s.hardware:
        return "hardware"
    if names.RPC_SYSTEM in s.attributes:
        return "rpc"
    return "control"


def _metadata(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def to_chrome(spans: Sequence[Span], job_id: str = "") -> dict[str, Any]:
    """The spans as a Chrome trace (module docstring)."""
    if not spans:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(s.start_ns for s in spans)
    services = sorted({s.service for s in spans}, key=_service_order)
    pids = {service: i + 1 for i, service in enumerate(services)}
    events: list[dict[str, Any]] = []
    for service in services:
        mine = [s for s in spans if s.service == service]
        pid = pids[service]
        events.append(_metadata("process_name", pid, 0, {"name": service}))
        events.append(_metadata("process_sort_index", pid, 0, {"sort_index": pid}))
        lanes = _lanes(mine)
        hardware = all(s.hardware for s in mine)
        for lane in sorted(set(lanes)):
            label = "emulated timeline" if hardware else f"lane {lane}"
            events.append(_metadata("thread_name", pid, lane, {"name": label}))
        for s, lane in zip(mine, lanes, strict=True):
            events.append(
                {
                    "name": s.name,
                    "cat": _category(s),
                    "ph": "X",
                    "ts": (s.start_ns - t0) / 1000,
                    "dur": max(0, s.end_ns - s.start_ns) / 1000,
                    "pid": pid,
                    "tid": lane,
                    "args": {
                        **s.attributes,
                        "trace_id": s.trace_id,
                        "span_id": s.span_id,
                        "parent_id": s.parent_id,
                        "status": s.status_code,
                    },
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "job_id": job_id,
            "t0_unix_ns": t0,
            "clock": "µs from t0, wall time; hardware spans: wall time at the job's "
            "reservation plus the emulated offset",
        },
    }
