"""Socket objects (no Ray) driven as their actors would drive them."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rdurack.node_agent.runs import Run
from rdurack.node_agent.socket import Socket


def together(sockets: dict[str, Socket], call: Callable[[Socket], Run]) -> dict[str, Run]:
    """Each socket runs its part at once, as its actor would."""
    with ThreadPoolExecutor(len(sockets)) as pool:
        futures = {sid: pool.submit(call, s) for sid, s in sockets.items()}
        return {sid: f.result(timeout=30) for sid, f in futures.items()}
