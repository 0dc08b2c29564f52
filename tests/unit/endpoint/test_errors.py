"""Bad requests get OpenAI's error body, their status and a one-line message; none
crashes the server or leaks a batch slot; a client that goes away frees its slot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rdurack.endpoint.engine import Engine
from tests.support.endpoint import Endpoint, endpoint

MODEL = "llama3.1-8b"


@pytest.fixture(scope="module")
def served() -> Iterator[Endpoint]:
    with endpoint((MODEL,)) as e:
        yield e


def _wait_idle(engine: Engine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.running or engine.waiting:
        assert time.monotonic() < deadline, (engine.running, engine.waiting)
        time.sleep(0.01)


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "\n" not in body["error"]["message"]
    return dict(body["error"])


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "said"),
    [
        ("/v1/completions", {"model": MODEL}, 400, "prompt", "Field required"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400,
         "max_tokens", "greater than or equal to 1"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n", "n = 1"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 9}, 400,
         "temperature", "less than or equal to 2"),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt",
         "one prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a"] * 5}, 400, "stop",
         "at most 4"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages",
         "at least 1"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot"}]}, 400,
         "messages.0.role", "Input should be"),
        ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "model", "unknown model"),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * 40_000_000}, 400, "messages",
         "exceeds what the sockets hold"),
    ],
)  # fmt: skip
def test_a_bad_request_is_refused_by_name(
    served: Endpoint, path: str, body: dict[str, Any], status: int, param: str, said: str
) -> None:
    response = httpx.post(served.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    error = _error(response)
    assert error["param"] == param and said in error["message"], error
    _wait_idle(served.engines[MODEL])


def test_a_body_that_is_not_json_is_a_400(served: Endpoint) -> None:
    response = httpx.post(
        served.url + "/v1/completions",
        content=b"{nope",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    assert "JSON" in _error(response)["message"]


def test_the_queue_bound_answers_429_with_retry_after() -> None:
    # One slot and one waiting place: the third request finds the queue full.
    from rdurack.workloads.serving.stream.replay import StreamSetting

    setting = StreamSetting(MODEL, sockets=1, max_batch=1)
    with endpoint((MODEL,), setting, time_scale=1.0, max_waiting=1) as e, httpx.Client() as c:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 5000, "stream": True}
        url = e.url + "/v1/completions"
        with c.stream("POST", url, json=body, timeout=60) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # admitted and producing
            with c.stream("POST", url, json=body, timeout=60) as second:
                assert second.status_code == 200  # it waits
                # One running, one waiting, as the engine sees it, before the third (a
                # loaded machine once answered the third 200: this says in what state).
                engine = e.engines[MODEL]
                deadline = time.monotonic() + 10
                while (engine.running, engine.waiting) != (1, 1):
                    assert time.monotonic() < deadline, (engine.running, engine.waiting)
                    time.sleep(0.01)
                third = c.post(url, json=body, timeout=60)
                assert third.status_code == 429
                assert int(third.headers["retry-after"]) >= 1
                assert _error(third)["code"] == "queue_full"
        _wait_idle(e.engines[MODEL])  # both streams closed early: their slots freed


def test_a_client_that_leaves_mid_stream_frees_its_slot_at_once() -> None:
    with endpoint((MODEL,), time_scale=1.0) as e, httpx.Client() as c:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 5000, "stream": True}
        with c.stream("POST", e.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert e.engines[MODEL].running == 1
        # 5000 tokens would take tens of emulated (and wall) seconds; it is gone now.
        _wait_idle(e.engines[MODEL], timeout_s=10.0)
        assert e.engines[MODEL].scheduler.reserved_tokens == 0
