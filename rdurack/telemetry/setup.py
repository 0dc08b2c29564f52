"""The one place the OpenTelemetry SDK is configured.

Every process calls `configure` once: the orchestrator and node agent entrypoints, and
each socket actor on construction (with its socket id as `service.name`, so Jaeger
shows one lane per socket). Everything else uses the OpenTelemetry API only.

With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans go out over OTLP/gRPC (Jaeger ingests
OTLP natively). With `RDURACK_TRACE_DIR` set, every process also appends its finished
spans to `$RDURACK_TRACE_DIR/<service.name>-<pid>.jsonl` (telemetry/file_export.py),
which `rdu trace` and `rdu plot` read. With neither, no exporter is installed: spans
still get real trace ids, so context propagates, but nothing is kept.
`OTEL_SDK_DISABLED=true` installs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from rdurack.telemetry.file_export import TRACE_DIR_ENV, JsonlSpanExporter
from rdurack.telemetry.names import SERVICE_NAME

# A socket emits a burst of hardware spans (every kernel call and collective) in
# little wall time; the SDK's default queue (2048) would drop spans under such a burst
# while the exporter is busy. Spans are small: 65536 of them are a few tens of MB.
MAX_QUEUE_SIZE = 65536
MAX_EXPORT_BATCH_SIZE = 2048
# Trace files: a local append is cheap, so batches go out every 0.5 s (the SDK's default
# is 5 s): a process that is killed without a flush loses at most that much.
FILE_SCHEDULE_DELAY_MS = 500


def processors(
    env: Mapping[str, str] | None = None, service_name: str = "rdurack"
) -> list[SpanProcessor]:
    """The span processors `configure` installs for the environment `env`: OTLP when
    `OTEL_EXPORTER_OTLP_ENDPOINT` is set, trace files when `RDURACK_TRACE_DIR` is."""
    env = os.environ if env is None else env
    found: list[SpanProcessor] = []
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        # Imported only when exporting: the exporter pulls in its own gRPC stubs.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        found.append(
            BatchSpanProcessor(
                OTLPSpanExporter(),  # endpoint, headers, TLS: from the OTEL_* environment
                max_queue_size=MAX_QUEUE_SIZE,
                max_export_batch_size=MAX_EXPORT_BATCH_SIZE,
            )
        )
    trace_dir = env.get(TRACE_DIR_ENV)
    if trace_dir:
        found.append(
            BatchSpanProcessor(
                JsonlSpanExporter(trace_dir, service_name),
                max_queue_size=MAX_QUEUE_SIZE,
                max_export_batch_size=MAX_EXPORT_BATCH_SIZE,
                schedule_delay_millis=FILE_SCHEDULE_DELAY_MS,
            )
        )
    return found


def exporting(env: Mapping[str, str] | None = None) -> bool:
    """Whether `processors` installs any for `env`: whether a span made goes anywhere."""
    env = os.environ if env is None else env
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(TRACE_DIR_ENV))


def configure(service_name: str, *, env_name_wins: bool = True) -> TracerProvider | None:
    """Install this process's tracer provider, named `service_name` (or
    `OTEL_SERVICE_NAME` when set and `env_name_wins`; a socket passes False: its lane is
    its id). Idempotent: a second call returns the provider already installed.
    Returns None when tracing is disabled (`OTEL_SDK_DISABLED=true`)."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    name = (os.environ.get("OTEL_SERVICE_NAME") if env_name_wins else None) or service_name
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    for processor in processors(service_name=name):
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    # set_tracer_provider refuses a second provider (another thread may have won).
    installed = trace.get_tracer_provider()
    return installed if isinstance(installed, TracerProvider) else None


def flush(timeout_ms: int = 5000) -> bool:
    """Export what is queued now; True when everything went out (or nothing is set)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        return provider.force_flush(timeout_ms)
    return True


def shutdown() -> None:
    """Flush and stop the exporter (entrypoints call it on their way out)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()
