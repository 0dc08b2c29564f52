"""`rdu serve`: an OpenAI-compatible endpoint whose tokens come when the emulated
sockets would produce them (rdurack/endpoint/, docs/serving.md). Its security options
are the orchestrator's, by name and variable: `--tokens` (RDURACK_TOKENS), `--tls-cert`
and `--tls-key` (RDURACK_TLS_CERT, RDURACK_TLS_KEY), so a Kubernetes pod mounts the
same Secrets the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rdurack.cli.options import SpecOpt
from rdurack.cli.predict import PlatformOpt
from rdurack.cli.stream import DEFAULT_MAX_BATCH, ChunkTokensOpt, MaxBatchOpt, PolicyOpt
from rdurack.client.connection import Target
from rdurack.client.rack import RackClient
from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.models import builtin_models
from rdurack.rack.whatif import load_platform
from rdurack.security.auth import Authenticator
from rdurack.security.tls import ENV_CERT, ENV_KEY
from rdurack.telemetry import setup
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.replay import StreamSetting
from rdurack.workloads.serving.stream.scheduler import DEFAULT_CHUNK_TOKENS, Policy

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
KeyOpt = Annotated[
    Path | None,
    typer.Option("--tls-key", envvar=ENV_KEY, help="HTTPS: the certificate's private key (PEM)"),
]


def serve_cmd(
    platform: PlatformOpt = "sn40l-rack16",
    model: ModelsOpt = None,
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
    *,
    to: Target,
) -> None:
    """Serve the OpenAI API (/v1/models, /v1/completions, /v1/chat/completions, streamed
    or not), /metrics and /health, each model batched on its own sockets under --policy,
    each iteration priced by the timing model (on the rack's sockets with --rack) and its
    tokens paced at --time-scale."""
    from rdurack.endpoint.auth import Gate  # its web stack, only when serving
    from rdurack.endpoint.server import engines, https, serve

    tls = https(tls_cert, tls_key)  # a bad file or flag refused before anything is built
    auth = Authenticator.from_file(tokens)
    names = model or ["llama3.1-8b"]
    known = builtin_models()
    for name in names:
        if name not in known:
            raise UnknownName("model", name, sorted(known))
    if len(set(names)) < len(names):
        raise InvalidRequest(f"--model: each model once, got {names}")
    if chunk_tokens is not None and policy is not Policy.CHUNKED:
        raise InvalidRequest("--chunk-tokens is --policy chunked-prefill's")
    # This process's tracing, as the rack's other processes set theirs up: a trace per
    # completion request, and the calls to the rack (docs/tracing.md). The requests'
    # spans only when they go somewhere (OTLP, trace files): made for nothing, they
    # would cost the endpoint about 15% of its requests per second (docs/tracing.md).
    provider = setup.configure("rdurack-endpoint")
    traced = provider if provider is not None and setup.exporting() else None
    channel = to.channel() if rack else None
    if channel is not None:
        platform = RackClient(channel).status().platform  # the rack's, whatever was given
    p = Predictor(load_platform(platform, spec))
    per_model = sockets or max(1, p.platform.sockets // len(names))
    if per_model * len(names) > p.platform.sockets:
        raise InvalidRequest(
            f"{len(names)} models x {per_model} sockets exceed {p.platform.name}'s "
            f"{p.platform.sockets}"
        )
    setting = StreamSetting(
        names[0],
        per_model,
        policy or Policy.CONTINUOUS,
        max_batch or DEFAULT_MAX_BATCH,
        chunk_tokens or DEFAULT_CHUNK_TOKENS,
    )
    served = engines(p, names, setting, known, time_scale, max_waiting, channel)
    gate = Gate(auth, {name: per_model for name in names})
    scheme = "https" if tls else "http"
    where = f" of the rack at {to.address}" if rack else ""
    say = Console(stderr=True, soft_wrap=True, highlight=False).print  # a line stays a line
    say(
        f"serving {', '.join(names)} on {per_model} {p.platform.name} sockets each{where} "
        f"at {scheme}://{host}:{port}/v1 (time scale {time_scale:g}); Ctrl-C stops"
    )
    say(f"security: {'HTTPS' if tls else 'plain HTTP'}, {gate.notice()}")
    try:
        serve(served, host, port, gate, tls, traced)
    finally:
        if channel is not None:
            channel.close()
        setup.shutdown()  # what is queued goes out
