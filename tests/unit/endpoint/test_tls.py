"""The endpoint over HTTPS with the rack's certificate files (`--tls-cert/--tls-key`):
a client trusting the rack CA gets its answers, plain HTTP on the same port gets none,
and a bad certificate or key is one line before anything starts."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rdurack.endpoint.app import create_app
from rdurack.endpoint.server import engines, https
from rdurack.errors import InvalidRequest
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.replay import StreamSetting
from tests.support.certs import RackCerts, make_rack_certs
from tests.support.endpoint import in_thread
from tests.support.ports import free_port

MODEL = "llama3.1-8b"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> RackCerts:
    return make_rack_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def url(certs: RackCerts) -> Iterator[str]:
    served = engines(
        Predictor(platform("sn40l-rack16")),
        [MODEL],
        StreamSetting(MODEL, sockets=1),
        builtin_models(),
        0.0,
    )
    tls = https(certs.member.cert_file, certs.member.key_file)
    with in_thread(create_app(served), free_port(), tls=tls) as u:
        yield u


def _trusting(certs: RackCerts) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.client.ca_file))


def test_an_https_client_of_the_rack_ca_is_answered(url: str, certs: RackCerts) -> None:
    assert url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=_trusting(certs), timeout=30) as http:
        assert http.get(f"{url}/health").status_code == 200
    # The openai client, told to trust the rack CA as its docs say (its own HTTP client).
    trusting = openai.DefaultHttpxClient(verify=_trusting(certs))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", http_client=trusting)
    done = client.completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert done.usage is not None and done.usage.completion_tokens == 3


def test_plain_http_and_untrusting_clients_get_nothing(url: str) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(url.replace("https://", "http://") + "/health", timeout=30)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/health", timeout=30)  # the system's CAs do not know the rack's


def test_bad_certificate_files_are_one_line(tmp_path: Path, certs: RackCerts) -> None:
    member, stranger = certs.member, certs.stranger
    assert member.cert_file and member.key_file and stranger.key_file
    assert https(None, None) is None
    with pytest.raises(InvalidRequest, match="go together"):
        https(member.cert_file, None)
    with pytest.raises(InvalidRequest, match="does not belong to certificate"):
        https(member.cert_file, stranger.key_file)
    with pytest.raises(InvalidRequest, match="No such file"):
        https(tmp_path / "missing.crt", member.key_file)
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(InvalidRequest, match="not a PEM certificate"):
        https(tmp_path / "junk.pem", member.key_file)
