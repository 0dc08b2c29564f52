"""Trace files: every finished span as one JSON line, for runs without a collector.

With `RDURACK_TRACE_DIR` set, `setup.configure` adds this exporter (behind a batch
processor) to every process: the orchestrator, each node agent and each socket actor.
Each process appends to its own file, `<service.name>-<pid>.jsonl`, so processes never
share a file and need no locks between them. Every batch is written as whole lines and
flushed at once, so a process that crashes (or a socket actor that Ray kills, which
runs no exit handler) loses at most the batch it was writing: at worst a torn last
line, which `read_records` skips. `rdu trace` and `rdu plot` read these files
(traces/spans.py).

One line, one span (times are Unix epoch nanoseconds, ids lower-case hex):

    {"trace_id": "32 hex", "span_id": "16 hex", "parent_id": "16 hex" | null,
     "name": ..., "kind": "INTERNAL" | "SERVER" | "CLIENT" | "PRODUCER" | "CONSUMER",
     "service": service.name, "pid": ..., "scope": the tracer's name,
     "start_ns": ..., "end_ns": ..., "attributes": {...},
     "status": {"code": "UNSET" | "OK" | "ERROR", "description": ...},
     "links": [{"trace_id", "span_id", "attributes"}],
     "events": [{"name", "time_ns", "attributes"}]}
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rdurack.telemetry.names import SERVICE_NAME

TRACE_DIR_ENV = "RDURACK_TRACE_DIR"
SUFFIX = ".jsonl"
# A file name keeps letters, digits, '.', '_' and '-' of a service name.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_name(service: str, pid: int) -> str:
    """`<service.name>-<pid>.jsonl`, the service name made safe for a file name."""
    return f"{_UNSAFE.sub('_', service) or 'unknown'}-{pid}{SUFFIX}"


def _hex(value: int, digits: int) -> str:
    return f"{value:0{digits}x}"


def _value(value: Any) -> Any:
    """An attribute value as JSON: str, bool, int and float as they are; sequences
    (OTel's homogeneous arrays, given as tuples) as lists."""
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    if isinstance(value, Sequence):
        return [_value(v) for v in value]
    return str(value)


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: _value(v) for k, v in (attributes or {}).items()}


def span_record(span: ReadableSpan, pid: int | None = None) -> dict[str, Any]:
    """One finished span as the JSON object a trace file line holds."""
    ctx = span.get_span_context()
    if ctx is None:  # only a span that was never started has none
        raise ValueError(f"span {span.name!r} has no context")
    parent = span.parent
    status = span.status
    return {
        "trace_id": _hex(ctx.trace_id, 32),
        "span_id": _hex(ctx.span_id, 16),
        "parent_id": _hex(parent.span_id, 16) if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "service": str(span.resource.attributes.get(SERVICE_NAME, "unknown")),
        "pid": os.getpid() if pid is None else pid,
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else "",
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": _attributes(span.attributes),
        "status": {"code": status.status_code.name, "description": status.description or ""},
        "links": [
            {
                "trace_id": _hex(link.context.trace_id, 32),
                "span_id": _hex(link.context.span_id, 16),
                "attributes": _attributes(link.attributes),
            }
            for link in span.links
        ],
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": _attributes(e.attributes)}
            for e in span.events
        ],
    }


class JsonlSpanExporter(SpanExporter):
    """Appends each span to `directory/<service>-<pid>.jsonl` as one JSON line.

    The file is opened on the first export, and again under the new pid if the process
    forked since (a child never appends to its parent's file). Thread-safe: the batch
    processor exports from its own thread, `force_flush` from the caller's."""

    def __init__(self, directory: str | Path, service: str) -> None:
        self.directory = Path(directory)
        self.service = service
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._pid = -1
        self._closed = False

    @property
    def path(self) -> Path:
        """The file this process writes (it may not exist before the first export)."""
        return self.directory / file_name(self.service, os.getpid())

    def _open(self) -> IO[str]:
        pid = os.getpid()
        if self._file is None or self._pid != pid:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Appending and line-buffered: a crash tears at most the line being written.
            self._file = (self.directory / file_name(self.service, pid)).open(
                "a", encoding="utf-8", buffering=1
            )
            self._pid = pid
        return self._file

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            lines = "".join(json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans)
            with self._lock:
                out = self._open()
                out.write(lines)
                out.flush()
        except (OSError, TypeError, ValueError):
            # An exporter must not raise into the SDK; the batch is lost, the next goes on.
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if self._file is not None:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None


def trace_files(directory: str | Path) -> list[Path]:
    """The trace files of a directory, by name."""
    return sorted(Path(directory).glob(f"*{SUFFIX}"))


def read_records(path: str | Path) -> Iterator[dict[str, Any] | None]:
    """The span records of one trace file, in order; None for a line that is not a
    JSON object (a torn last line of a process that crashed while writing it)."""
    with Path(path).open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                yield None
                continue
            yield record if isinstance(record, dict) else None
