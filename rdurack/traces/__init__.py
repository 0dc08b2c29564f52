"""Trace files read back: a job's spans from the trace files every process writes
(telemetry/file_export.py), exported for Jaeger and Perfetto (`rdu trace`) and drawn
(`rdu plot`, `rdu bench paper --plot`, and a serving study's `rdu predict serve --plot`).

- spans.py: the spans of a trace dir (`Span`, `TraceSet`, `read_trace_dir`) and one
  job's among them (`select_job`, `job_spans`); `TraceError`.
- jaeger.py: the spans as Jaeger trace JSON (`to_jaeger`) and its check
  (`validate_jaeger`).
- chrome.py: the spans as a Chrome/Perfetto trace (`to_chrome`).
- export.py: `write_trace`, the two files `rdu trace` writes.
- plotdata/: what the plots show, derived from spans and job results; no matplotlib.
- plots/: the drawing, with matplotlib.
"""
