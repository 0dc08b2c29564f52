"""One job's trace from the trace files, as Jaeger trace JSON and as a Chrome/Perfetto
trace (`rdu trace`), and the spans `rdu plot` draws from.

The files are those of telemetry/file_export.py: one JSON line per span, one file per
process, in the trace dir. A job's spans are every span of the trace(s) that hold a span
with `rdurack.job.id` = the job id, restricted to the spans that carry the id, their
descendants and their ancestors. So the job span's trace is taken whole (its RPCs, the
node agents' spans, the sockets' operations), and if a trace were ever shared by several
jobs (a scheduling round that is the parent of each job it placed), each job keeps only
its own branch and the round.

Two clocks (docs/tracing.md): control-plane spans are in wall time; hardware spans
(`rdu.*`) carry the emulated start and duration as attributes and are stamped at the
wall time the job reserved the socket plus the emulated offset. Both outputs use the
spans' wall stamps, as Jaeger would; the plots use the emulated attributes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdurack.errors import RdurackError
from rdurack.telemetry import names
from rdurack.telemetry.file_export import read_records, trace_files

# Jaeger's reference types: OTel parents are CHILD_OF, links FOLLOWS_FROM (as Jaeger's
# own OTLP receiver translates them).
CHILD_OF = "CHILD_OF"
FOLLOWS_FROM = "FOLLOWS_FROM"
TAG_TYPES = ("string", "bool", "int64", "float64", "binary")
_HEX = re.compile(r"^[0-9a-f]+$")
HARDWARE_PREFIX = "rdu."  # hardware span names: rdu.kernel, rdu.expert_switch, ...
ENABLE_HINT = (
    "trace files are written when RDURACK_TRACE_DIR is set: `rdu up` sets it to "
    "STATE_DIR/traces for every process it starts (start the rack again if it predates "
    "this), or pass --trace-dir DIR"
)


class TraceError(RdurackError):
    """No trace dir, no files in it, or no span of the job: one line, exit code 2."""

    exit_code = 2


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class SpanLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """One span of a trace file. Times are Unix epoch ns, ids lower-case hex."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    pid: int
    start_ns: int
    end_ns: int
    kind: str = "INTERNAL"
    scope: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: str = "UNSET"
    status_description: str = ""
    links: tuple[SpanLink, ...] = ()
    events: tuple[dict[str, Any], ...] = ()

    @property
    def job_id(self) -> str | None:
        value = self.attributes.get(names.ATTR_JOB_ID)
        return value if isinstance(value, str) else None

    @property
    def hardware(self) -> bool:
        """A socket's operation on the emulated timeline."""
        return self.name.startswith(HARDWARE_PREFIX) and isinstance(
            self.attributes.get(names.ATTR_EMULATED_START_NS), int
        )

    @property
    def emulated_start_ns(self) -> int:
        return int(self.attributes.get(names.ATTR_EMULATED_START_NS, 0))

    @property
    def emulated_end_ns(self) -> int:
        return self.emulated_start_ns + int(self.attributes.get(names.ATTR_EMULATED_NS, 0))

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> Span:
        """A span from one trace file record; KeyError/TypeError/ValueError if it is not
        one (the reader counts such lines as bad)."""
        status = r.get("status") or {}
        span = cls(
            trace_id=str(r["trace_id"]),
            span_id=str(r["span_id"]),
            parent_id=str(r["parent_id"]) if r.get("parent_id") else None,
            name=str(r["name"]),
            service=str(r.get("service") or "unknown"),
            pid=int(r.get("pid") or 0),
            start_ns=int(r["start_ns"]),
            end_ns=int(r["end_ns"]),
            kind=str(r.get("kind") or "INTERNAL"),
            scope=str(r.get("scope") or ""),
            attributes=dict(r.get("attributes") or {}),
            status_code=str(status.get("code") or "UNSET"),
            status_description=str(status.get("description") or ""),
            links=tuple(
                SpanLink(str(k["trace_id"]), str(k["span_id"]), dict(k.get("attributes") or {}))
                for k in r.get("links") or ()
            ),
            events=tuple(dict(e) for e in r.get("events") or ()),
        )
        if not (_HEX.match(span.trace_id) and _HEX.match(span.span_id)):
            raise ValueError(f"ids are not hex: {span.trace_id!r}, {span.span_id!r}")
        return span


@dataclass(frozen=True)
class TraceSet:
    """Every span of a trace dir, and what could not be read."""

    directory: Path
    spans: tuple[Span, ...]
    files: int
    bad_lines: int  # torn last lines of crashed processes, or lines that are not spans

    def job_ids(self) -> list[str]:
        """The job ids the spans carry, the most recently started first."""
        latest: dict[str, int] = {}
        for s in self.spans:
            if s.job_id is not None:
                latest[s.job_id] = max(latest.get(s.job_id, 0), s.start_ns)
        return sorted(latest, key=lambda j: -latest[j])


def read_trace_dir(directory: str | Path) -> TraceSet:
    """Every span of the trace files of `directory`. Raises TraceError when the
    directory does not exist or holds no trace file."""
    path = Path(directory)
    if not path.is_dir():
        raise TraceError(f"no trace dir {path}: {ENABLE_HINT}")
    files = trace_files(path)
    if not files:
        raise TraceError(f"no trace files (*.jsonl) in {path}: {ENABLE_HINT}")
    spans: list[Span] = []
    bad = 0
    for f in files:
        for record in read_records(f):
            if record is None:
                bad += 1
                continue
            try:
                spans.append(Span.from_record(record))
            except (KeyError, TypeError, ValueError):
                bad += 1
    return TraceSet(path, tuple(spans), len(files), bad)


def select_job(traces: TraceSet, job_id: str) -> list[Span]:
    """The job's spans (module docstring), by start time. Raises TraceError, listing
    the jobs that do have spans, when none carries `job_id`."""
    seeds = [s for s in traces.spans if s.job_id == job_id]
    if not seeds:
        known = traces.job_ids()
        shown = ", ".join(known[:8]) + (f" and {len(known) - 8} more" if len(known) > 8 else "")
        which = f"jobs with spans there: {shown}" if known else "no span there names a job"
        raise TraceError(
            f"no spans of job {job_id!r} in {traces.directory} "
            f"({len(traces.spans)} spans in {traces.files} files; {which})"
        )
    trace_ids = {s.trace_id for s in seeds}
    in_traces = [s for s in traces.spans if s.trace_id in trace_ids]
    by_key = {(s.trace_id, s.span_id): s for s in in_traces}
    children: dict[tuple[str, str], list[Span]] = {}
    for s in in_traces:
        if s.parent_id is not None:
            children.setdefault((s.trace_id, s.parent_id), []).append(s)
    keep: dict[tuple[str, str], Span] = {}
    # Descendants of the spans that carry the id (the job span's whole subtree) ...
    stack = list(seeds)
    while stack:
        s = stack.pop()
        key = (s.trace_id, s.span_id)
        if key in keep:
            continue
        keep[key] = s
        stack.extend(children.get(key, ()))
    # ... and their ancestors.
    for s in seeds:
        parent = s.parent_id
        while parent is not None and (s.trace_id, parent) in by_key:
            up = by_key[(s.trace_id, parent)]
            keep[(up.trace_id, up.span_id)] = up
            parent = up.parent_id
    return sorted(keep.values(), key=lambda s: (s.start_ns, s.end_ns))


# ------------------------------------------------------------------ Jaeger trace JSON


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
        out = []
        for s in members:
            references = []
            warnings = []
            if s.parent_id is not None:
                references.append({"refType": CHILD_OF, "traceID": trace_id, "spanID": s.parent_id})
                if s.parent_id not in present:
                    warnings.append(f"parent span {s.parent_id} is not in the trace files (lost)")
            references += [
                {"refType": FOLLOWS_FROM, "traceID": k.trace_id, "spanID": k.span_id}
                for k in s.links
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
            out.append(
                {
                    "traceID": trace_id,
                    "spanID": s.span_id,
                    "flags": 1,
                    "operationName": s.name,
                    "references": references,
                    "startTime": _us(s.start_ns),
                    "duration": _duration_us(s.start_ns, s.end_ns),
                    "tags": tags,
                    "logs": logs,
                    "processID": processes[(s.service, s.pid)],
                    "warnings": warnings or None,
                }
            )
        data.append(
            {
                "traceID": trace_id,
                "spans": out,
                "processes": {
                    pid_key: {"serviceName": service, "tags": [_tag("pid", pid)]}
                    for (service, pid), pid_key in processes.items()
                },
                "warnings": None,
            }
        )
    return {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


def _hex_id(value: Any, lengths: tuple[int, ...]) -> bool:
    return isinstance(value, str) and len(value) in lengths and bool(_HEX.match(value))


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
        processes = trace.get("processes")
        if not isinstance(processes, dict) or not processes:
            problems.append(f"{where}.processes: not a non-empty object")
            processes = {}
        for key, process in processes.items():
            at = f"{where}.processes[{key!r}]"
            if not isinstance(process, dict):
                problems.append(f"{at}: not an object")
                continue
            if not isinstance(process.get("serviceName"), str) or not process["serviceName"]:
                problems.append(f"{at}.serviceName: not a non-empty string")
            _check_tags(process.get("tags", []), at, problems)
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
            references = s.get("references", [])
            if not isinstance(references, list):
                problems.append(f"{at}.references: not a list")
                continue
            parents = 0
            for j, ref in enumerate(references):
                rat = f"{at}.references[{j}]"
                if not isinstance(ref, dict) or ref.get("refType") not in (CHILD_OF, FOLLOWS_FROM):
                    problems.append(f"{rat}: refType is not CHILD_OF or FOLLOWS_FROM")
                    continue
                if not _hex_id(ref.get("traceID"), (16, 32)) or not _hex_id(
                    ref.get("spanID"), (16,)
                ):
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
    return problems


# ------------------------------------------------------------------ Chrome / Perfetto


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


def to_chrome(spans: Sequence[Span], job_id: str = "") -> dict[str, Any]:
    """The spans as a Chrome trace (chrome://tracing, ui.perfetto.dev): one process per
    service, so each socket is its own lane; complete ("X") events with ts and dur in
    µs from the first span, and metadata ("M") events naming processes and threads."""
    if not spans:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(s.start_ns for s in spans)
    services = sorted({s.service for s in spans}, key=_service_order)
    pids = {service: i + 1 for i, service in enumerate(services)}
    events: list[dict[str, Any]] = []
    for service in services:
        mine = [s for s in spans if s.service == service]
        pid = pids[service]
        events.append(
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": service}}
        )
        events.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": pid},
            }
        )
        lanes = _lanes(mine)
        hardware = all(s.hardware for s in mine)
        for lane in sorted(set(lanes)):
            label = "emulated timeline" if hardware else f"lane {lane}"
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": lane, "args": {"name": label}}
            )
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


# ------------------------------------------------------------------ rdu trace


@dataclass(frozen=True)
class Written:
    """What `write_trace` wrote, and the numbers `rdu trace` reports."""

    jaeger: Path
    chrome: Path
    spans: int
    services: int
    sockets: int
    missing_parents: int
    bad_lines: int


def job_spans(job_id: str, trace_dir: str | Path) -> tuple[list[Span], TraceSet]:
    traces = read_trace_dir(trace_dir)
    return select_job(traces, job_id), traces


def write_trace(job_id: str, trace_dir: str | Path, out_dir: str | Path) -> Written:
    """Write `<job>.jaeger.json` and `<job>.chrome.json` into `out_dir`."""
    spans, traces = job_spans(job_id, trace_dir)
    jaeger = to_jaeger(spans)
    problems = validate_jaeger(jaeger, allow_missing_parents=True)
    if problems:  # a bug here, not the user's: say what, not a traceback
        raise RdurackError(f"the Jaeger JSON of job {job_id} is malformed: {problems[0]}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jaeger_path = out / f"{job_id}.jaeger.json"
    chrome_path = out / f"{job_id}.chrome.json"
    jaeger_path.write_text(json.dumps(jaeger) + "\n")
    chrome_path.write_text(json.dumps(to_chrome(spans, job_id)) + "\n")
    present = {(s.trace_id, s.span_id) for s in spans}
    missing = sum(
        1 for s in spans if s.parent_id is not None and (s.trace_id, s.parent_id) not in present
    )
    return Written(
        jaeger_path,
        chrome_path,
        len(spans),
        len({s.service for s in spans}),
        len({s.service for s in spans if s.hardware}),
        missing,
        traces.bad_lines,
    )


def hardware_spans(spans: Iterable[Span]) -> list[Span]:
    return [s for s in spans if s.hardware]
