"""The endpoint's Deployment (k8s/components/serve) runs `rdu serve` as the CLI defines
it: its args parse as the command's options, the variables it sets are the ones those
options read, its model fits its sockets on the overlay's rack, its port is the
Service's and the policy's, and its probes ask the open /health over HTTPS."""

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

SECRETS_ENV = {"RDURACK_TOKENS", "RDURACK_TLS_CERT", "RDURACK_TLS_KEY"}


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
    rendered: dict[str, list[Obj]], overlay: str, serve: Any
) -> None:
    docs = rendered[overlay]
    deployment, c = _endpoint(docs)
    assert c["command"] == ["rdu", "serve"]
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
    # The Secrets reach it through the variables its options read.
    envvars = {p.envvar for p in serve.params if getattr(p, "envvar", None)}
    assert envvars >= SECRETS_ENV and env_of(c).keys() >= SECRETS_ENV
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[kind]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/health", "https", "HTTPS"), kind


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
    p = Predictor(load_platform(options["platform"], spec))
    models = list(options["model"])
    sockets = int(options["sockets"])
    assert sockets * len(models) <= p.platform.sockets
    served = engines(p, models, StreamSetting(models[0], sockets=sockets), builtin_models())
    assert sorted(served) == sorted(models)
