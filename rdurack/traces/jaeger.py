"""A job's spans as Jaeger trace JSON, and the check of that format.

`to_jaeger` writes the JSON Jaeger's API returns and its UI's "JSON File" upload reads;
`validate_jaeger` lists what in a document would break that upload (`rdu trace` runs it
on what it writes, the tests on what they break on purpose). Both use the spans' wall
stamps, as Jaeger would (spans.py: the two clocks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from rdurack.traces.spans import HEX, Span

# Jaeger's reference types: OTel parents are CHILD_OF, links FOLLOWS_FROM (as Jaeger's
# own OTLP receiver translates them).
CHILD_OF = "CHILD_OF"
FOLLOWS_FROM = "FOLLOWS_FROM"
TAG_TYPES = ("string", "bool", "int64", "float64", "binary")


# ------------------------------------------------------------------ the export


def _tag(key: str, value: Any) -> dict[str, Any]:
    """A Jaeger tag. Arrays become JSON strings, as Jaeger's OTLP translator does."""
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    return {"key": key, "type": "string", "value": json.dumps(value)}


def _us(ns: int) -> int:
    return ns // 1000


def _duration_us(start_ns: int, end_ns: int) -> int:
    """Whole µs from the µs the span starts in to the µs it ends in, so a child never
    sticks out of its parent by rounding."""
    return max(0, math.ceil(end_ns / 1000) - start_ns // 1000)


def _span(s: Span, trace_id: str, present: set[str], process_id: str) -> dict[str, Any]:
    """One span of a trace whose spans' ids are `present`."""
    references = []
    warnings = []
    if s.parent_id is not None:
        references.append({"refType": CHILD_OF, "traceID": trace_id, "spanID": s.parent_id})
        if s.parent_id not in present:
            warnings.append(f"parent span {s.parent_id} is not in the trace files (lost)")
    references += [
        {"refType": FOLLOWS_FROM, "traceID": k.trace_id, "spanID": k.span_id} for k in s.links
    ]
    tags = [_tag(k, v) for k, v in s.attributes.items()]
    tags.append(_tag("otel.scope.name", s.scope))
    if s.kind != "INTERNAL":
        tags.append(_tag("span.kind", s.kind.lower()))
    if s.status_code != "UNSET":
        tags.append(_tag("otel.status_code", s.status_code))
    if s.status_code == "ERROR":
        tags.append(_tag("error", True))
        if s.status_description:
            tags.append(_tag("otel.status_description", s.status_description))
    logs = [
        {
            "timestamp": _us(int(e.get("time_ns", s.start_ns))),
            "fields": [
                _tag("event", str(e.get("name", ""))),
                *(_tag(k, v) for k, v in dict(e.get("attributes") or {}).items()),
            ],
        }
        for e in s.events
    ]
    return {
        "traceID": trace_id,
        "spanID": s.span_id,
        "flags": 1,
        "operationName": s.name,
        "references": references,
        "startTime": _us(s.start_ns),
        "duration": _duration_us(s.start_ns, s.end_ns),
        "tags": tags,
        "logs": logs,
        "processID": process_id,
        "warnings": warnings or None,
    }


def to_jaeger(spans: Sequence[Span]) -> dict[str, Any]:
    """The spans as the trace JSON Jaeger's API returns and its UI's "JSON File" upload
    reads: {"data": [one object per trace]}. Times in µs since the epoch."""
    traces: dict[str, list[Span]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    data = []
    for trace_id, members in traces.items():
        present = {s.span_id for s in members}
        processes: dict[tuple[str, int], str] = {}
        for service, pid in sorted({(s.service, s.pid) for s in members}):
            processes[(service, pid)] = f"p{len(processes) + 1}"
        data.append(
            {
                "traceID": trace_id,
                "spans": [
                    _span(s, trace_id, present, processes[(s.service, s.pid)]) for s in members
                ],
                "processes": {
                    pid_key: {"serviceName": service, "tags": [_tag("pid", pid)]}
                    for (service, pid), pid_key in processes.items()
                },
                "warnings": None,
            }
        )
    return {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}


# ------------------------------------------------------------------ the check


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hex_id(value: Any, lengths: tuple[int, ...]) -> bool:
    return isinstance(value, str) and len(value) in lengths and bool(HEX.match(value))


def _check_tags(tags: Any, where: str, problems: list[str]) -> None:
    if not isinstance(tags, list):
        problems.append(f"{where}: tags is not a list")
        return
    for i, t in enumerate(tags):
        at = f"{where}.tags[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("key"), str) or not t.get("key"):
            problems.append(f"{at}: not an object with a non-empty string key")
            continue
        kind, value = t.get("type"), t.get("value")
        if kind not in TAG_TYPES:
            problems.append(f"{at}: type {kind!r} is not one of {', '.join(TAG_TYPES)}")
        elif kind == "bool" and not isinstance(value, bool):
            problems.append(f"{at}: a bool tag holds {value!r}")
        elif kind == "int64" and not _is_int(value):
            problems.append(f"{at}: an int64 tag holds {value!r}")
        elif kind == "float64" and (isinstance(value, bool) or not isinstance(value, int | float)):
            problems.append(f"{at}: a float64 tag holds {value!r}")
        elif kind in ("string", "binary") and not isinstance(value, str):
            problems.append(f"{at}: a {kind} tag holds {value!r}")


def _check_processes(trace: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """The trace's processes (empty when they are not an object)."""
    processes = trace.get("processes")
    if not isinstance(processes, dict) or not processes:
        problems.append(f"{where}.processes: not a non-empty object")
        return {}
    for key, process in processes.items():
        at = f"{where}.processes[{key!r}]"
        if not isinstance(process, dict):
            problems.append(f"{at}: not an object")
            continue
        if not isinstance(process.get("serviceName"), str) or not process["serviceName"]:
            problems.append(f"{at}.serviceName: not a non-empty string")
        _check_tags(process.get("tags", []), at, problems)
    return processes


def _check_references(
    s: dict[str, Any],
    at: str,
    trace_id: Any,
    ids: set[str],
    allow_missing_parents: bool,
    problems: list[str],
) -> None:
    references = s.get("references", [])
    if not isinstance(references, list):
        problems.append(f"{at}.references: not a list")
        return
    parents = 0
    for j, ref in enumerate(references):
        rat = f"{at}.references[{j}]"
        if not isinstance(ref, dict) or ref.get("refType") not in (CHILD_OF, FOLLOWS_FROM):
            problems.append(f"{rat}: refType is not CHILD_OF or FOLLOWS_FROM")
            continue
        if not _hex_id(ref.get("traceID"), (16, 32)) or not _hex_id(ref.get("spanID"), (16,)):
            problems.append(f"{rat}: traceID/spanID are not hex ids")
            continue
        if ref["refType"] != CHILD_OF:
            continue  # a link may name a span of another trace
        parents += 1
        if ref["traceID"] != trace_id:
            problems.append(f"{rat}: a CHILD_OF reference to another trace")
        elif ref["spanID"] not in ids and not allow_missing_parents:
            problems.append(f"{rat}: parent {ref['spanID']} is not in the trace")
        elif ref["spanID"] == s.get("spanID"):
            problems.append(f"{rat}: a span is its own parent")
    if parents > 1:
        problems.append(f"{at}: {parents} CHILD_OF references (at most one)")


def _check_span(
    s: dict[str, Any],
    at: str,
    trace_id: Any,
    processes: dict[str, Any],
    problems: list[str],
) -> None:
    """Everything of one span but its references."""
    if s.get("traceID") != trace_id:
        problems.append(f"{at}.traceID: {s.get('traceID')!r} is not the trace's")
    if not _hex_id(s.get("spanID"), (16,)):
        problems.append(f"{at}.spanID: {s.get('spanID')!r} is not 16 hex digits")
    if not isinstance(s.get("operationName"), str) or not s["operationName"]:
        problems.append(f"{at}.operationName: not a non-empty string")
    for key in ("startTime", "duration"):
        if not _is_int(s.get(key)) or s[key] < 0:
            problems.append(f"{at}.{key}: {s.get(key)!r} is not a whole number of µs")
    if s.get("processID") not in processes:
        problems.append(f"{at}.processID: {s.get('processID')!r} is not in processes")
    _check_tags(s.get("tags"), at, problems)
    logs = s.get("logs", [])
    if not isinstance(logs, list):
        problems.append(f"{at}.logs: not a list")
        logs = []
    for j, log in enumerate(logs):
        if not isinstance(log, dict) or not _is_int(log.get("timestamp")):
            problems.append(f"{at}.logs[{j}]: no whole-µs timestamp")
            continue
        _check_tags(log.get("fields"), f"{at}.logs[{j}]", problems)


def validate_jaeger(doc: Any, *, allow_missing_parents: bool = False) -> list[str]:
    """What is wrong with `doc` as Jaeger trace JSON (empty: nothing). Checks the keys
    and types the UI's JSON-file upload needs: traces with hex ids (trace 16 or 32
    digits, span 16), spans with integer µs start and duration, typed tags, logs, a
    processID every span has defined in `processes`, well-formed references (CHILD_OF or
    FOLLOWS_FROM), at most one CHILD_OF per span, and span ids unique per trace. A
    CHILD_OF reference must name a span of the same trace that is in the document,
    unless `allow_missing_parents` (spans a crashed process never wrote)."""
    problems: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        return ['the document is not an object with a "data" list']
    if not doc["data"]:
        return ['"data" holds no trace']
    for t_index, trace in enumerate(doc["data"]):
        where = f"data[{t_index}]"
        if not isinstance(trace, dict):
            problems.append(f"{where}: not an object")
            continue
        trace_id = trace.get("traceID")
        if not _hex_id(trace_id, (16, 32)):
            problems.append(f"{where}.traceID: {trace_id!r} is not 16 or 32 hex digits")
        processes = _check_processes(trace, where, problems)
        spans = trace.get("spans")
        if not isinstance(spans, list) or not spans:
            problems.append(f"{where}.spans: not a non-empty list")
            continue
        ids: set[str] = set()
        for i, s in enumerate(spans):
            if isinstance(s, dict) and isinstance(s.get("spanID"), str):
                if s["spanID"] in ids:
                    problems.append(f"{where}.spans[{i}]: span id {s['spanID']} is not unique")
                ids.add(s["spanID"])
        for i, s in enumerate(spans):
            at = f"{where}.spans[{i}]"
            if not isinstance(s, dict):
                problems.append(f"{at}: not an object")
                continue
            _check_span(s, at, trace_id, processes, problems)
            _check_references(s, at, trace_id, ids, allow_missing_parents, problems)
    return problems
