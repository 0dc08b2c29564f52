"""The endpoint's Prometheus metrics, with vLLM's names and meanings, labelled by model
(`model_name`, as vLLM labels them), so dashboards built for vLLM read them. Latencies
are the emulated ones, in seconds; the gauges are read at each scrape.

One registry per app (no process-wide default), so two apps in one process (the tests)
keep their own counts.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rdurack.endpoint.engine import Engine, Handle, Token
from rdurack.workloads.serving.stream.scheduler import Running

LABEL = "model_name"
# Buckets (s): vLLM's for time to first token and request latency, roughly.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
               0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0)  # fmt: skip


class EndpointMetrics:
    """vLLM's serving metrics for the engines of one endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token",
                              [LABEL], buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency",
                             [LABEL], buckets=ITL_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency",
                             [LABEL], buckets=REQUEST_BUCKETS, registry=r)  # fmt: skip
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time in the queue",
                               [LABEL], buckets=REQUEST_BUCKETS, registry=r)  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed",
                                     [LABEL], registry=r)  # fmt: skip
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens",
                                         [LABEL], registry=r)  # fmt: skip
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch",
                             [LABEL], registry=r)  # fmt: skip
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to start",
                             [LABEL], registry=r)  # fmt: skip
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full",
                        [LABEL], registry=r)  # fmt: skip

    def watch(self, engine: Engine) -> None:
        """Observe `engine`'s requests as they go, and read its gauges at each scrape."""
        model = engine.model
        self.running.labels(model).set_function(lambda: engine.running)
        self.waiting.labels(model).set_function(lambda: engine.waiting)
        s = engine.scheduler
        self.kv.labels(model).set_function(lambda: s.reserved_tokens / s.kv_budget_tokens)
        engine.on_token = self._on_token(model)
        engine.on_done = self._on_done(model)

    def _on_token(self, model: str) -> Callable[[Handle, Token], None]:
        def seen(h: Handle, t: Token) -> None:
            self.generation_tokens.labels(model).inc()
            if t.index == 0:
                self.ttft.labels(model).observe(t.emulated_s - h.arrival.at_s)
                self.prompt_tokens.labels(model).inc(h.arrival.prompt_tokens)
                if h.admitted_s is not None:
                    self.queue.labels(model).observe(h.admitted_s - h.arrival.at_s)
            else:
                self.itl.labels(model).observe(t.emulated_s - h.last_s)
            h.last_s = t.emulated_s

        return seen

    def _on_done(self, model: str) -> Callable[[Handle, Running | None], None]:
        def done(h: Handle, r: Running | None) -> None:
            if r is not None and r.token_s:  # served to the end (not cancelled)
                self.e2e.labels(model).observe(r.token_s[-1] - h.arrival.at_s)

        return done
