"""A CoE bundle behind the endpoint (`rdu serve --experts`): its experts listed as
models, the bundle's name routed by the router, and the emulated times the predictor's
replay of the same arrivals gives."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from rdurack.endpoint.app import EXPERT_HEADER, create_app
from rdurack.endpoint.engine import Handle
from rdurack.endpoint.server import engines
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.bundle import BUNDLE_NAME, BundleSetting
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.report import Percentiles
from rdurack.workloads.serving.stream.scheduler import Policy, Running
from tests.support.endpoint import in_thread
from tests.support.ports import free_port

P = Predictor(platform("sn40l-rack16"))
MODELS = builtin_models()
EXPERTS = 150
BUNDLE = StreamSetting(BUNDLE_NAME, 8, Policy.CONTINUOUS, 16, bundle=BundleSetting(EXPERTS))
PRESET = StreamSetting("llama3.1-8b", 8)
PROMPTS = [  # the router's domains differ: code, maths, law, cooking
    "write a python function that sorts a list of integers",
    "solve the quadratic equation x squared minus five x plus six",
    "draft a contract clause on liability and indemnification",
    "a recipe to bake sourdough bread with a crisp crust",
]


def _serve(recorded: list[Arrival]) -> tuple[Any, Any]:
    served = engines(P, ["llama3.1-8b"], PRESET, MODELS, 0.0, bundle=BUNDLE)
    engine = served[BUNDLE_NAME]
    app = create_app(served)  # its metrics watch the engine: wrapped after
    observe = engine.on_done

    def done(h: Handle, r: Running | None) -> None:
        observe(h, r)
        recorded.append(h.arrival)

    engine.on_done = done
    return app, engine


async def _ask(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))


def test_the_bundle_routes_and_times_as_the_predictor_replays() -> None:
    recorded: list[Arrival] = []
    app, engine = _serve(recorded)
    router = engine.pricer.bundle.router
    bodies = [{"model": BUNDLE_NAME, "prompt": p, "max_tokens": 6} for p in PROMPTS]
    bodies += [{"model": "math-algebra", "prompt": PROMPTS[0], "max_tokens": 4}]
    with in_thread(app, free_port()) as url:
        listed = openai.OpenAI(base_url=f"{url}/v1", api_key="none").models.list()
        answers = asyncio.run(_ask(url, bodies))
    names = [m.id for m in listed.data]
    assert names[:2] == ["llama3.1-8b", BUNDLE_NAME] and len(names) == 2 + EXPERTS
    assert "coding-python" in names
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    experts = [a.headers[EXPERT_HEADER] for a in answers]
    assert experts[:4] == [router.names[router.route(p)] for p in PROMPTS]
    assert len(set(experts[:4])) == 4  # four domains, four experts
    assert experts[4] == "math-algebra"  # named: not routed, whatever the prompt
    by_index = {a.index: a for a in recorded}
    assert sorted(a.routed for a in recorded) == [False, True, True, True, True]
    assert {a.expert for a in recorded} == set(experts)
    # The predictor replays the arrivals the engine recorded to the same times.
    want = replay(P, BUNDLE, sorted(by_index.values(), key=lambda a: a.at_s), MODELS)
    usages = [a.json()["usage"] for a in answers]
    got = Percentiles.of([u["time_to_first_token"] for u in usages])
    for q in ("mean", "p50", "max"):
        assert getattr(got, q) == pytest.approx(getattr(want.ttft_s, q), rel=1e-9), q
    e2e = Percentiles.of([u["total_latency"] for u in usages])
    assert e2e.max == pytest.approx(want.e2e_s.max, rel=1e-9)
    assert want.switches is not None and want.switches >= 4


def test_an_unknown_model_and_a_prompt_over_the_window_get_one_line() -> None:
    app, _ = _serve([])
    with in_thread(app, free_port()) as url:
        r = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x"})
        one = httpx.get(f"{url}/v1/models/coding-python")
        body = {"model": "coding-python", "prompt": "word " * 4000, "max_tokens": 200}
        long = httpx.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "\n" not in message and f"{BUNDLE_NAME}'s experts (GET /v1/models)" in message
    assert one.status_code == 200 and one.json()["id"] == "coding-python"
    assert long.status_code == 400
    assert "context window of 4096 tokens" in long.json()["error"]["message"]
