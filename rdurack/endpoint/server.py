"""An endpoint's engines and its HTTP server: `rdu serve`.

Each model served gets an engine whose iterations are priced by the timing model
(workloads/serving/stream/pricing.py), on its own group of sockets of the platform, and
paced at `time_scale`: in this process (`priced`), or on a running rack's sockets, held
by an endpoint job per model (endpoint/rack.py), which `serve` holds before it answers
and releases when it stops. The server speaks HTTPS given a certificate and its key
(the rack's `--tls-cert/--tls-key` files), and checks the rack's tokens given a Gate.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import uvicorn
from opentelemetry.trace import TracerProvider

from rdurack.endpoint.app import create_app
from rdurack.endpoint.auth import Gate
from rdurack.endpoint.engine import Engine, Executor
from rdurack.endpoint.rack import RackModel
from rdurack.errors import InvalidRequest
from rdurack.rack.models import ModelSpec
from rdurack.security.tls import PAIR, read_key_pair
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.pricing import Pass, Pricer
from rdurack.workloads.serving.stream.replay import StreamSetting, prepare

# Assumption: 256 requests may wait per model before 429 (vLLM queues without bound;
# a bound makes overload visible to a client's retry logic). Set it with --max-waiting.
DEFAULT_MAX_WAITING = 256


def priced(pricer: Pricer) -> Executor:
    """An executor that runs nothing: the timing model says how long an iteration takes."""

    async def run(passes: Sequence[Pass], start_s: float) -> list[float]:
        return [pricer.seconds(p) for p in passes]

    return run


def engines(
    p: Predictor,
    names: Sequence[str],
    setting: StreamSetting,
    models: dict[str, ModelSpec],
    time_scale: float = 1.0,
    max_waiting: int = DEFAULT_MAX_WAITING,
    rack: grpc.Channel | None = None,
    bundle: StreamSetting | None = None,
) -> dict[str, Engine]:
    """An engine per model name, each set as `setting` says but for its model, and one
    for the `bundle` if given (a CoE bundle's setting); with `rack` (a channel to its
    orchestrator), its iterations run on the rack's sockets."""
    out = {}
    settings = [replace(setting, model=name) for name in names]
    for one in [*settings, *([bundle] if bundle is not None else [])]:
        name = one.model
        pricer, scheduler = prepare(p, one, models)
        if rack is None:
            out[name] = Engine(name, scheduler, pricer, priced(pricer), time_scale, max_waiting)
            continue
        # A call to the rack costs wall time: it may carry several iterations, planned
        # with the same timing model the sockets run.
        model = RackModel(rack, p.platform.name, pricer, scheduler)
        out[name] = Engine(name, scheduler, pricer, model, time_scale, max_waiting, True)
    return out


def on_rack(served: dict[str, Engine]) -> list[RackModel]:
    """The engines' models that run on a rack."""
    out: list[RackModel] = []
    for e in served.values():
        if isinstance(e.executor, RackModel):
            out.append(e.executor)
    return out


@dataclass(frozen=True)
class Https:
    """This server's certificate and its key (PEM files), already checked to belong
    together."""

    cert_file: Path
    key_file: Path


def https(cert: Path | None, key: Path | None) -> Https | None:
    """HTTPS with `cert` and `key`, checked first so that a bad file is one line
    (InvalidRequest) rather than uvicorn's traceback; None (plain HTTP) without either."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidRequest(f"TLS: {PAIR}")
    read_key_pair(cert, key)
    return Https(cert, key)


def serve(
    served: dict[str, Engine],
    host: str,
    port: int,
    gate: Gate | None = None,
    tls: Https | None = None,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Hold the models' sockets on the rack (if they run on one), then serve until
    interrupted (uvicorn handles SIGINT and SIGTERM), HTTPS given `tls`; the sockets are
    released after. Prints `endpoint ready at HOST:PORT` once it listens (the port it
    got, given 0), as the rack's other processes do. `tracer_provider`: a trace per
    completion request (endpoint/tracing.py)."""
    config = uvicorn.Config(
        create_app(served, gate=gate, tracer_provider=tracer_provider),
        host=host,
        port=port,
        log_level="warning",
        ssl_certfile=None if tls is None else tls.cert_file,
        ssl_keyfile=None if tls is None else tls.key_file,
    )
    held = on_rack(served)
    # uvicorn stops on SIGTERM, then raises it again with the handler it found: this one
    # ends the process through `finally`, which releases the sockets (the default would
    # end it at once, leaving the endpoint jobs holding them).
    signal.signal(signal.SIGTERM, _exit)
    try:
        for model in held:
            model.hold()
        asyncio.run(_listen(uvicorn.Server(config)))
    finally:
        for model in held:
            model.release()


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


async def _listen(server: uvicorn.Server) -> None:
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)  # uvicorn offers no hook for "listening"
    if server.started:
        address = server.servers[0].sockets[0].getsockname()
        print(f"endpoint ready at {address[0]}:{address[1]}", flush=True)
    await serving
