"""Trace files read back: one job's spans, Jaeger and Perfetto exports, plots."""
