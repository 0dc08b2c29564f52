"""`rdu serve`: an OpenAI-compatible endpoint whose tokens come when the emulated
sockets would produce them (rdurack/endpoint/, docs/serving.md). Its security options
are the orchestrator's, by name and variable: `--tokens` (RDURACK_TOKENS), `--tls-cert`
and `--tls-key` (RDURACK_TLS_CERT, RDURACK_TLS_KEY), so a Kubernetes pod mounts the
same Secrets the same way."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rdurack.cli.options import SpecOpt
from rdurack.cli.predict import PlatformOpt
from rdurack.cli.stream import DEFAULT_MAX_BATCH, ChunkTokensOpt, MaxBatchOpt, PolicyOpt
from rdurack.client.connection import Target
from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.models import builtin_models
from rdurack.rack.whatif import load_platform
from rdurack.security.auth import Authenticator
from rdurack.security.tls import ENV_CERT, ENV_KEY
from rdurack.telemetry import setup
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.bundle import BUNDLE_NAME, BundleSetting
from rdurack.workloads.serving.stream.replay import StreamSetting
from rdurack.workloads.serving.stream.scheduler import DEFAULT_CHUNK_TOKENS, Policy

# --wait-rack at most: an hour; a rack not up by then is not coming without a hand.
WAIT_RACK_MAX_S = 3600.0
ModelsOpt = Annotated[
    list[str] | None,
    typer.Option("--model", help="a model preset to serve (repeat for several)"),
]
TokensOpt = Annotated[
    Path | None,
    typer.Option(
        "--tokens",
        envvar="RDURACK_TOKENS",
        help="the rack's tokens file: every request needs a bearer token; a tenant may use "
        "the models on no more sockets than its socket quota",
    ),
]
CertOpt = Annotated[
    Path | None,
    typer.Option("--tls-cert", envvar=ENV_CERT, help="HTTPS: this server's certificate (PEM)"),
]
ExpertsOpt = Annotated[
    int | None,
    typer.Option(
        "--experts",
        min=1,
        help=f"also serve a CoE bundle, {BUNDLE_NAME}, of this many catalog experts "
        "(Llama2-7B, routed by a Llama2-7B router, on one node's sockets: PAPER's "
        "Samba-CoE has 150); the bundle's name routes, each expert's name is a model too",
    ),
]
KeyOpt = Annotated[
    Path | None,
    typer.Option("--tls-key", envvar=ENV_KEY, help="HTTPS: the certificate's private key (PEM)"),
]


def serve_cmd(
    platform: PlatformOpt = "sn40l-rack16",
    model: ModelsOpt = None,
    experts: ExpertsOpt = None,
    sockets: Annotated[
        int | None,
        typer.Option(min=1, help="sockets per model; default: the platform's, shared out"),
    ] = None,
    policy: PolicyOpt = None,
    max_batch: MaxBatchOpt = None,
    chunk_tokens: ChunkTokensOpt = None,
    time_scale: Annotated[
        float,
        typer.Option(
            min=0, help="wall seconds per emulated second (1: real time; 0: as fast as it goes)"
        ),
    ] = 1.0,
    max_waiting: Annotated[
        int, typer.Option(min=1, help="requests waiting per model before 429")
    ] = 256,
    spec: SpecOpt = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to listen on")] = 8000,
    tokens: TokensOpt = None,
    tls_cert: CertOpt = None,
    tls_key: KeyOpt = None,
    rack: Annotated[
        bool,
        typer.Option(
            "--rack",
            help="run the iterations on the sockets of the rack at --address (an endpoint "
            "job per model holds them); its platform is the rack's",
        ),
    ] = False,
    wait_rack: Annotated[
        float,
        typer.Option(
            "--wait-rack",
            min=0,
            max=WAIT_RACK_MAX_S,
            help="with --rack: seconds to wait for the orchestrator to answer and then for "
            "the models' sockets, saying so (0: ask once; a pod that may start first)",
        ),
    ] = 0.0,
    *,
    to: Target,
) -> None:
    """Serve the OpenAI API (/v1/models, /v1/completions, /v1/chat/completions, streamed
    or not), /metrics and /health, each model batched on its own sockets under --policy,
    each iteration priced by the timing model (on the rack's sockets with --rack) and its
    tokens paced at --time-scale."""
    from rdurack.endpoint.auth import Gate  # its web stack, only when serving
    from rdurack.endpoint.models import Models
    from rdurack.endpoint.rack import reach
    from rdurack.endpoint.server import engines, https, on_rack, serve

    tls = https(tls_cert, tls_key)  # a bad file or flag refused before anything is built
    auth = Authenticator.from_file(tokens)
    names = model or ([] if experts else ["llama3.1-8b"])
    known = builtin_models()
    for name in names:
        if name not in known:
            raise UnknownName("model", name, sorted(known))
    if len(set(names)) < len(names):
        raise InvalidRequest(f"--model: each model once, got {names}")
    if chunk_tokens is not None and policy is not Policy.CHUNKED:
        raise InvalidRequest("--chunk-tokens is --policy chunked-prefill's")
    if wait_rack and not rack:
        raise InvalidRequest("--wait-rack is --rack's")
    say = Console(stderr=True, soft_wrap=True, highlight=False).print  # a line stays a line
    # This process's tracing, as the rack's other processes set theirs up: a trace per
    # completion request, and the calls to the rack (docs/tracing.md). The requests'
    # spans only when they go somewhere (OTLP, trace files): made for nothing, they
    # would cost the endpoint about 15% of its requests per second (docs/tracing.md).
    provider = setup.configure("rdurack-endpoint")
    traced = provider if provider is not None and setup.exporting() else None
    channel = None
    started = time.monotonic()
    if rack:
        # The rack's platform, whatever was given; waiting for it first if asked to.
        platform = reach(to.channel, to.address, wait_rack, say).platform
        channel = to.channel()
    p = Predictor(load_platform(platform, spec))
    # A bundle is tensor parallel over one node (workloads/coe/bundle.py).
    on_bundle = p.platform.node.sockets if experts else 0
    left = p.platform.sockets - on_bundle
    per_model = sockets or max(1, left // max(1, len(names)))
    if per_model * len(names) + on_bundle > p.platform.sockets:
        bundle = f" and a bundle on {on_bundle}" if on_bundle else ""
        raise InvalidRequest(
            f"{len(names)} models x {per_model} sockets{bundle} exceed {p.platform.name}'s "
            f"{p.platform.sockets}"
        )
    setting = StreamSetting(
        names[0] if names else BUNDLE_NAME,
        per_model,
        policy or Policy.CONTINUOUS,
        max_batch or DEFAULT_MAX_BATCH,
        chunk_tokens or DEFAULT_CHUNK_TOKENS,
    )
    coe = None
    if experts:
        coe = replace(setting, model=BUNDLE_NAME, sockets=on_bundle)
        coe = replace(coe, bundle=BundleSetting(experts))
    served = engines(p, names, setting, known, time_scale, max_waiting, channel, coe)
    if wait_rack:
        # What is left of the wait goes to holding the sockets (a rack whose node agents
        # are still starting, an orchestrator restarting), never less than a hold's own
        # bound.
        remaining = wait_rack - (time.monotonic() - started)
        for held in on_rack(served):
            held.hold_timeout_s = max(held.hold_timeout_s, remaining)
            held.say = say
            held.patient = True
    gate = Gate(auth, Models(served).sockets())
    scheme = "https" if tls else "http"
    where = f" of the rack at {to.address}" if rack else ""
    what = [f"{', '.join(names)} on {per_model} {p.platform.name} sockets each"] if names else []
    if coe is not None:
        what.append(f"{BUNDLE_NAME} ({experts} experts) on {on_bundle} sockets")
    say(
        f"serving {' and '.join(what)}{where} at {scheme}://{host}:{port}/v1 "
        f"(time scale {time_scale:g}); Ctrl-C stops"
    )
    say(f"security: {'HTTPS' if tls else 'plain HTTP'}, {gate.notice()}")
    try:
        serve(served, host, port, gate, tls, traced)
    finally:
        if channel is not None:
            channel.close()
        setup.shutdown()  # what is queued goes out
