"""An endpoint's engines and its HTTP server: `rdu serve`.

Each model served gets an engine whose iterations are priced by the timing model
(workloads/serving/stream/pricing.py), on its own group of sockets of the platform, and
paced at `time_scale`. The server speaks HTTPS given a certificate and its key (the
rack's `--tls-cert/--tls-key` files), and checks the rack's tokens given a Gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import uvicorn

from rdurack.endpoint.app import create_app
from rdurack.endpoint.auth import Gate
from rdurack.endpoint.engine import Engine, Executor
from rdurack.errors import InvalidRequest
from rdurack.rack.models import ModelSpec
from rdurack.security.tls import PAIR, read_key_pair
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.pricing import Pricer
from rdurack.workloads.serving.stream.replay import StreamSetting, prepare
from rdurack.workloads.serving.stream.scheduler import Iteration

# Assumption: 256 requests may wait per model before 429 (vLLM queues without bound;
# a bound makes overload visible to a client's retry logic). Set it with --max-waiting.
DEFAULT_MAX_WAITING = 256


def priced(pricer: Pricer) -> Executor:
    """An executor that runs nothing: the timing model says how long an iteration takes."""

    async def run(it: Iteration) -> float:
        return pricer(it).seconds

    return run


def engines(
    p: Predictor,
    names: Sequence[str],
    setting: StreamSetting,
    models: dict[str, ModelSpec],
    time_scale: float = 1.0,
    max_waiting: int = DEFAULT_MAX_WAITING,
) -> dict[str, Engine]:
    """An engine per model name, each set as `setting` says but for its model."""
    out = {}
    for name in names:
        pricer, scheduler = prepare(p, replace(setting, model=name), models)
        out[name] = Engine(name, scheduler, priced(pricer), time_scale, max_waiting)
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
) -> None:
    """Serve until interrupted (uvicorn handles SIGINT and SIGTERM); HTTPS given `tls`."""
    uvicorn.run(
        create_app(served, gate=gate),
        host=host,
        port=port,
        log_level="warning",
        ssl_certfile=None if tls is None else tls.cert_file,
        ssl_keyfile=None if tls is None else tls.key_file,
    )
