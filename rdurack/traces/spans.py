"""The spans of the trace files read back, and one job's spans chosen among them.

The files are those of telemetry/file_export.py: one JSON line per span, one file per
process, in the trace dir. `read_trace_dir` reads them all into a `TraceSet`;
`select_job` keeps a job's spans: every span of the trace(s) that hold a span with
`rdurack.job.id` = the job id, restricted to the spans that carry the id, their
descendants and their ancestors. So the job span's trace is taken whole (its RPCs, the
node agents' spans, the sockets' operations), and if a trace were ever shared by several
jobs (a scheduling round that is the parent of each job it placed), each job keeps only
its own branch and the round. `TraceError` says why there is nothing to read.

Two clocks (docs/tracing.md): control-plane spans are in wall time; hardware spans
(`rdu.*`, `Span.hardware`) carry the emulated start and duration as attributes and are
stamped at the wall time the job reserved the socket plus the emulated offset.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdurack.errors import RdurackError
from rdurack.telemetry import names
from rdurack.telemetry.file_export import read_records, trace_files

HEX = re.compile(r"^[0-9a-f]+$")
HARDWARE_PREFIX = "rdu."  # hardware span names: rdu.kernel, rdu.expert_switch, ...
ENABLE_HINT = (
    "trace files are written when RDURACK_TRACE_DIR is set: `rdu up` sets it to "
    "STATE_DIR/traces for every process it starts (start the rack again if it predates "
    "this), or pass --trace-dir DIR"
)


class TraceError(RdurackError):
    """No trace dir, no files in it, or no span of the job: one line, exit code 2."""

    exit_code = 2


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
        if not (HEX.match(span.trace_id) and HEX.match(span.span_id)):
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


def job_spans(job_id: str, trace_dir: str | Path) -> tuple[list[Span], TraceSet]:
    """The job's spans in `trace_dir`, and all that was read there."""
    traces = read_trace_dir(trace_dir)
    return select_job(traces, job_id), traces


def hardware_spans(spans: Iterable[Span]) -> list[Span]:
    """The sockets' operations among `spans` (`Span.hardware`)."""
    return [s for s in spans if s.hardware]
