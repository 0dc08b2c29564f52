"""The endpoint's Deployment (k8s/components/serve) runs `rdu serve --rack` as the CLI
defines it: its args parse as the command's options, the variables it sets are the ones
those options read (the Secrets' files: its HTTPS certificate and HTTP callers' tokens,
the rack CA and its own token for the orchestrator), it dials the orchestrator's
Service, waits for the rack within what its startup probe allows, its model fits its
sockets on the overlay's rack with sockets left for jobs, its port is the Service's and
the policy's, and its probes ask the open /health over HTTPS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from rdurack.cli.main import build_app
from rdurack.endpoint.server import engines
from rdurack.rack.models import builtin_models
from rdurack.rack.whatif import load_platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.replay import StreamSetting
from tests.support.manifests import OVERLAYS, Obj, env_of, find

# The Secrets' files, each in the variable of its option: HTTPS (--tls-cert, --tls-key)
# and HTTP callers' tokens (--tokens); the connection to the orchestrator (--tls-ca,
# --token-file), as any `rdu` client's.
SECRETS_ENV = {
    "RDURACK_TOKENS": "tokens",
    "RDURACK_TLS_CERT": "tls_cert",
    "RDURACK_TLS_KEY": "tls_key",
    "RDURACK_TLS_CA": "tls_ca",
    "RDURACK_TOKEN_FILE": "token_file",
}
# What the endpoint may take to start once the rack answers and its sockets are held
# (building its engines, uvicorn listening), beyond --wait-rack, wall s.
START_S = 10


@pytest.fixture(scope="module")
def serve() -> Any:
    """`rdu serve` as a click command (typer's own click: typed Any here)."""
    command: Any = get_command(build_app())
    return command.commands["serve"]


def _endpoint(docs: list[Obj]) -> tuple[Obj, Obj]:
    deployment = find(docs, "Deployment", "rdurack-endpoint")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _options(serve: Any, args: list[str]) -> dict[str, Any]:
    """`rdu serve ARGS` parsed as the command parses them, each value checked for its
    type and range, without running it; an unknown option fails."""
    with serve.make_context("serve", list(args)) as ctx:
        params: dict[str, Any] = ctx.params
    return params


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_endpoint_runs_rdu_serve_with_its_options(
    rendered: dict[str, list[Obj]], overlay: str, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered[overlay]
    deployment, c = _endpoint(docs)
    assert c["command"] == ["rdu", "serve"]
    envvars = {p.envvar: p.name for p in serve.params if getattr(p, "envvar", None)}
    for var in envvars:  # the args alone, whatever this shell exports
        monkeypatch.delenv(var, raising=False)
    options = _options(serve, c["args"])
    # One replica: each batches its own requests on its own emulated sockets.
    assert deployment["spec"]["replicas"] == 1
    assert options["host"] == "0.0.0.0"  # the kubelet's probes come to the pod IP
    port = int(options["port"])
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"https": port}
    (svc_port,) = find(docs, "Service", "rdurack-endpoint")["spec"]["ports"]
    assert (svc_port["port"], svc_port["targetPort"]) == (port, "https")
    (rule,) = find(docs, "NetworkPolicy", "rdurack-endpoint")["spec"]["ingress"]
    assert rule == {"ports": [{"protocol": "TCP", "port": port}]}
    # The Secrets reach it through the variables its options read: parsed with the
    # pod's environment, each option is its Secret's file.
    assert {v: envvars.get(v) for v in SECRETS_ENV} == SECRETS_ENV
    for e in c["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    in_pod = _options(serve, c["args"])
    for var, name in SECRETS_ENV.items():
        assert options[name] is None and in_pod[name] == Path(env_of(c)[var]["value"]), var
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[kind]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/health", "https", "HTTPS"), kind


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_endpoint_runs_on_the_racks_sockets_and_waits_for_the_rack(
    rendered: dict[str, list[Obj]], overlay: str, serve: Any
) -> None:
    docs = rendered[overlay]
    deployment, c = _endpoint(docs)
    options = _options(serve, c["args"])
    assert options["rack"] is True
    # It dials the orchestrator's Service on its API port (TLS: the Service's name is
    # the one its certificate carries, test_secrets.py).
    svc = find(docs, "Service", "rdurack-orchestrator")
    (api,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    assert options["address"] == f"{svc['metadata']['name']}:{api['port']}"
    (orch,) = find(docs, "Deployment", "rdurack-orchestrator")["spec"]["template"]["spec"][
        "containers"
    ]
    assert int(env_of(orch)["RDURACK_ORCHESTRATOR_PORT"]["value"]) == api["port"]
    assert options["token"] == ""  # the token is read from its Secret, never written here
    # The platform is the rack's: --platform would be ignored, so it is not given.
    assert "--platform" not in c["args"]
    # It waits for the rack, and the kubelet lets it: it listens only once it holds its
    # sockets, so a startup probe shorter than the wait would restart it while it waits.
    wait_s = float(options["wait_rack"])
    assert wait_s >= 180  # the node agents' own startup probe allows 3 minutes
    probe = c["startupProbe"]
    assert probe.get("initialDelaySeconds", 0) == 0
    assert probe["periodSeconds"] * probe["failureThreshold"] >= wait_s + START_S
    # The old pod releases its sockets before a new one asks for them.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_endpoints_model_fits_its_sockets_on_the_overlays_rack(
    rendered: dict[str, list[Obj]], overlay: str, serve: Any, tmp_path: Path
) -> None:
    docs = rendered[overlay]
    _, c = _endpoint(docs)
    options = _options(serve, c["args"])
    spec = tmp_path / "platform.yaml"
    spec.write_text(find(docs, "ConfigMap", "rdurack-spec")["data"]["platform.yaml"])
    assert options["spec"] == Path("/etc/rdurack/platform.yaml")  # the ConfigMap, mounted
    # The platform the rack reports: the orchestrator's (its default preset) under the
    # same spec, which is what `rdu serve --rack` loads.
    (orch,) = find(docs, "Deployment", "rdurack-orchestrator")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "RDURACK_PLATFORM" not in env_of(orch)
    p = Predictor(load_platform("sn40l-rack16", spec))
    models = list(options["model"])
    sockets = int(options["sockets"])
    # Its jobs hold their sockets for as long as it runs: the rack keeps some for jobs.
    assert sockets * len(models) < p.platform.sockets
    assert (p.platform.sockets, sockets, models) == (
        {"dev": 2, "rack16": 16}[overlay],
        1,
        ["llama3.1-8b"],
    )
    # The weights and a KV cache fit the sockets (else this refuses, naming the tier).
    served = engines(p, models, StreamSetting(models[0], sockets=sockets), builtin_models())
    assert sorted(served) == sorted(models)
    for engine in served.values():
        assert engine.scheduler.kv_budget_tokens >= 8192  # a long request fits
