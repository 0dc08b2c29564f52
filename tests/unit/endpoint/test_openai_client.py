"""The endpoint through the official `openai` client, changed only in base_url and
api_key: models, a completion, a streamed chat with usage; its figures are the
predictor's."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from rdurack.endpoint.text import chat_tokens, count_tokens
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from tests.support.endpoint import Endpoint, endpoint

MODEL = "llama3.1-8b"


@pytest.fixture(scope="module")
def served() -> Iterator[Endpoint]:
    with endpoint((MODEL, "llama2-7b")) as e:
        yield e


def _client(e: Endpoint) -> openai.OpenAI:
    return openai.OpenAI(base_url=e.base_url, api_key="not-checked", max_retries=0)


def test_the_client_lists_the_models_served(served: Endpoint) -> None:
    ids = [m.id for m in _client(served).models.list()]
    assert ids == [MODEL, "llama2-7b"]
    assert _client(served).models.retrieve(MODEL).owned_by == "rdurack"


def test_a_completion_has_its_tokens_and_the_emulated_timings(served: Endpoint) -> None:
    prompt = "Explain the memory wall in one line."
    done = _client(served).completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, seed=4, temperature=0.7
    )
    usage = done.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (count_tokens(prompt), 12)
    assert done.choices[0].finish_reason == "length"
    assert len(done.choices[0].text.split()) == 12  # one word a token
    again = _client(served).completions.create(model=MODEL, prompt=prompt, max_tokens=12, seed=4)
    assert again.choices[0].text == done.choices[0].text  # seeded: the same text
    # The timings are what the predictor says of this request alone.
    alone = replay(
        Predictor(platform("sn40l-rack16")),
        StreamSetting(MODEL, sockets=1),
        [Arrival(0, 0.0, count_tokens(prompt), 12)],
        builtin_models(),
    )
    extra = usage.model_extra or {}
    assert extra["time_to_first_token"] == pytest.approx(alone.ttft_s.p50, rel=1e-9)
    assert extra["total_latency"] == pytest.approx(alone.e2e_s.p50, rel=1e-9)
    assert extra["batch_size_used"] == 1
    assert extra["completion_tokens_per_sec"] == pytest.approx(12 / alone.e2e_s.p50)
    assert extra["completion_tokens_after_first_per_sec"] == pytest.approx(1 / alone.itl_s.mean)


def test_a_streamed_chat_comes_token_by_token_with_usage_last(served: Endpoint) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What does kernel looping buy?"},
    ]
    stream = _client(served).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert len(pieces) == 8 and all(pieces)
    assert chunks[-2].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    expected = chat_tokens(["Be brief.", "What does kernel looping buy?"])
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (expected, 8)
    assert len({c.id for c in chunks}) == 1


def test_a_stop_sequence_ends_the_text_and_frees_the_request(served: Endpoint) -> None:
    client = _client(served)
    free = client.completions.create(model=MODEL, prompt="x", max_tokens=40, seed=1)
    word = free.choices[0].text.split()[5]
    stopped = client.completions.create(model=MODEL, prompt="x", max_tokens=40, seed=1, stop=[word])
    assert stopped.choices[0].finish_reason == "stop"
    assert word not in stopped.choices[0].text
    assert free.choices[0].text.startswith(stopped.choices[0].text)
    usage = stopped.usage
    assert usage is not None and usage.completion_tokens < 40
    engine = served.engines[MODEL]
    assert (engine.running, engine.waiting) == (0, 0)
