"""The endpoint's Prometheus metrics carry vLLM's names, labelled by model, with the
emulated figures."""

from __future__ import annotations

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.endpoint import endpoint

MODEL = "llama3.1-8b"


def _samples(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, s.labels.get("model_name", ""))] = s.value
    return out


def test_metrics_have_vllms_names_and_count_what_was_served() -> None:
    with endpoint((MODEL,)) as e:
        client = openai.OpenAI(base_url=e.base_url, api_key="x", max_retries=0)
        for _ in range(3):
            client.completions.create(model=MODEL, prompt="abcd" * 10, max_tokens=5)
        m = _samples(e.url)
    assert m[("vllm:prompt_tokens_total", MODEL)] == 3 * 10
    assert m[("vllm:generation_tokens_total", MODEL)] == 3 * 5
    assert m[("vllm:time_to_first_token_seconds_count", MODEL)] == 3
    assert m[("vllm:inter_token_latency_seconds_count", MODEL)] == 3 * 4
    assert m[("vllm:e2e_request_latency_seconds_count", MODEL)] == 3
    assert m[("vllm:request_queue_time_seconds_count", MODEL)] == 3
    assert m[("vllm:time_to_first_token_seconds_sum", MODEL)] > 0
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc"):  # fmt: skip
        assert m[(gauge, MODEL)] == 0.0
