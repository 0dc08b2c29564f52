"""The rack's tokens on the endpoint, through the official `openai` client (changed only
in base_url and api_key) and raw HTTP: 401 as OpenAI answers a bad key, 403 for a model
on more sockets than the tenant's quota, the models list per caller, open probes and
metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rdurack.endpoint.app import create_app
from rdurack.endpoint.auth import Gate
from rdurack.endpoint.server import engines
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.security.auth import Authenticator, Principal
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.replay import StreamSetting
from tests.support.endpoint import endpoint, in_thread
from tests.support.ports import free_port
from tests.support.tokens import TOKENS, write_tokens

SMALL, BIG = "llama2-7b", "llama3.1-70b"
SOCKETS = {SMALL: 2, BIG: 8}  # bob's quota (4) is below BIG's sockets; alice's (8) is not


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    p = Predictor(platform("sn40l-rack16"))
    served = {
        name: engine
        for name, sockets in SOCKETS.items()
        for engine in engines(
            p, [name], StreamSetting(name, sockets=sockets), builtin_models(), 0.0
        ).values()
    }
    tokens = write_tokens(tmp_path_factory.mktemp("tokens") / "tokens.yaml")
    gate = Gate(Authenticator.from_file(tokens), SOCKETS)
    with in_thread(create_app(served, gate=gate), free_port()) as u:
        yield u


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer not-a-token-of-the-file", "Bearer", "Basic YWxpY2U6eA==",
     f"bearer{TOKENS['alice']}", "Bearer " + "x" * 600],
)  # fmt: skip
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", f"/v1/models/{SMALL}"), ("POST", "/v1/completions"),
     ("POST", "/v1/chat/completions"), ("GET", "/v1/no-such-route")],
)  # fmt: skip
def test_no_key_or_an_unknown_one_is_openais_401(
    url: str, authorization: str | None, method: str, path: str
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    body = {"model": SMALL, "prompt": "x"} if method == "POST" else None
    response = httpx.request(method, url + path, headers=headers, json=body, timeout=30)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    error = response.json()["error"]
    # The same answer whatever was wrong (it reveals nothing), in OpenAI's shape.
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        None,
        "invalid_api_key",
    )
    assert "Authorization: Bearer" in error["message"] and "\n" not in error["message"]


def test_the_openai_client_raises_authentication_error(url: str) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        _client(url, "sk-not-in-the-file").completions.create(model=SMALL, prompt="x")
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _client(url, "sk-not-in-the-file").models.list()


def test_a_model_above_the_tenants_quota_is_permission_denied(url: str) -> None:
    bob = _client(url, TOKENS["bob"])
    with pytest.raises(openai.PermissionDeniedError) as refused:
        bob.completions.create(model=BIG, prompt="x", max_tokens=2)
    assert refused.value.status_code == 403 and refused.value.code == "model_not_found"
    message = str(refused.value)
    assert "'bob'" in message and "8 sockets" in message and "quota of 4" in message
    with pytest.raises(openai.PermissionDeniedError):
        bob.chat.completions.create(
            model=BIG, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    with pytest.raises(openai.PermissionDeniedError):
        bob.models.retrieve(BIG)
    # Its own model, and a model that is not served at all (404, as for anyone).
    done = bob.completions.create(model=SMALL, prompt="x", max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        bob.completions.create(model="gpt-9", prompt="x")


@pytest.mark.parametrize(
    ("tenant", "listed"), [("bob", [SMALL]), ("alice", [SMALL, BIG]), ("ops", [SMALL, BIG])]
)
def test_models_lists_what_the_caller_may_use(url: str, tenant: str, listed: list[str]) -> None:
    client = _client(url, TOKENS[tenant])
    assert [m.id for m in client.models.list()] == listed
    for model in listed:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_probes_and_metrics_need_no_token(url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    scraped = httpx.get(f"{url}/metrics", timeout=30)
    assert scraped.status_code == 200 and "vllm:num_requests_running" in scraped.text
    # A wrong token on an open route is not refused either: the route asks for none.
    headers = {"Authorization": "Bearer wrong"}
    assert httpx.get(f"{url}/health", headers=headers, timeout=30).status_code == 200


def test_without_tokens_everything_is_open() -> None:
    with endpoint((SMALL,)) as e:
        assert httpx.get(f"{e.url}/health", timeout=30).status_code == 200
        ids = [m.id for m in _client(e.url, "anything").models.list()]
        assert ids == [SMALL]


@pytest.mark.parametrize(
    ("principal", "model", "refused"),
    [
        (Principal("bob", socket_quota=4), BIG, True),
        (Principal("bob", socket_quota=4), SMALL, False),
        (Principal("alice", socket_quota=8), BIG, False),  # a quota equal to the sockets
        (Principal("ops", admin=True, socket_quota=1), BIG, False),
        (Principal("free"), BIG, False),  # no quota
        (Principal("bob", socket_quota=4), "not-served", False),  # the app says 404
    ],
)
def test_who_may_use_which_model(
    tmp_path: Path, principal: Principal, model: str, refused: bool
) -> None:
    gate = Gate(Authenticator.from_file(write_tokens(tmp_path / "tokens.yaml")), SOCKETS)
    assert (gate.refusal(principal, model) is not None) == refused
