"""The one place OpenTelemetry is configured, and span names (with the cluster)."""
