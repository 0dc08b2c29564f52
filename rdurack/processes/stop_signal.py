"""How every rdurack process is told to stop: SIGTERM (Kubernetes, rdu down) or SIGINT."""

from __future__ import annotations

import signal
import threading


class StopSignal:
    """Wait for SIGTERM or SIGINT. `install` may be called again after a library (Ray's
    core worker) has replaced the handlers with its own."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def install(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        return self

    def wait(self) -> None:
        self._stop.wait()
