"""An OpenAI-compatible endpoint of the test's own: uvicorn in a thread on a free port,
engines priced by the timing model; HTTPS and the rack's tokens when a test asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from rdurack.endpoint.app import create_app
from rdurack.endpoint.engine import Engine
from rdurack.endpoint.server import Https, engines
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.replay import StreamSetting
from tests.support.ports import free_port


@dataclass
class Endpoint:
    url: str  # http://127.0.0.1:PORT
    engines: dict[str, Engine]

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@contextmanager
def in_thread(
    app: Any, port: int, start_timeout_s: float = 30.0, tls: Https | None = None
) -> Iterator[str]:
    """Serve an ASGI app on 127.0.0.1:port from a thread of this process until the
    block ends; yields its URL (https given `tls`, as `rdu serve` passes it)."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        ssl_certfile=None if tls is None else tls.cert_file,
        ssl_keyfile=None if tls is None else tls.key_file,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:  # uvicorn sets it once it listens
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the endpoint did not start on port {port}")
        time.sleep(0.01)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def endpoint(
    names: tuple[str, ...] = ("llama3.1-8b",),
    setting: StreamSetting | None = None,
    time_scale: float = 0.0,
    max_waiting: int = 256,
    start_timeout_s: float = 30.0,
) -> Iterator[Endpoint]:
    """Serve `names` on sn40l-rack16 (one socket each by default) until the block ends."""
    served = engines(
        Predictor(platform("sn40l-rack16")),
        names,
        setting or StreamSetting(names[0], sockets=1),
        builtin_models(),
        time_scale,
        max_waiting,
    )
    with in_thread(create_app(served), free_port(), start_timeout_s) as url:
        yield Endpoint(url, served)
