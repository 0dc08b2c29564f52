"""`rdu trace`: a job's trace written as `<job>.jaeger.json` (jaeger.py, checked before
it is written) and `<job>.chrome.json` (chrome.py), and the numbers it reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rdurack.errors import RdurackError
from rdurack.traces.chrome import to_chrome
from rdurack.traces.jaeger import to_jaeger, validate_jaeger
from rdurack.traces.spans import job_spans


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
