"""Telemetry, which any room may use: the one place the OpenTelemetry SDK is configured
(setup.py), span and attribute names (names.py), trace context across Ray calls and gRPC
(propagation.py), trace files for runs without a collector (file_export.py), and rack
metrics for Prometheus (metrics.py)."""
