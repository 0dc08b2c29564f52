"""An OpenAI-compatible endpoint of the test's own: uvicorn in a thread on a free port,
engines priced by the timing model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rdurack.endpoint.app import create_app
from rdurack.endpoint.engine import Engine
from rdurack.endpoint.server import engines, in_thread
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
