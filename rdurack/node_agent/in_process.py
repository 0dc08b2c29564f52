"""A whole rack of node agents in this process: how tests and benchmarks build one on
one machine, without the agents' own processes and servers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rdurack.node_agent.agent import NodeAgent
from rdurack.rack.spec import PlatformSpec


def start_rack(platform: PlatformSpec, **options: Any) -> list[NodeAgent]:
    """Start an agent for every node of `platform` in this process (in parallel), and
    give every socket the link addresses of all the others. `options` go to NodeAgent.
    This is how tests and benchmarks build a whole rack on one machine."""
    agents = [NodeAgent(i, platform, **options) for i in range(platform.nodes_total)]
    with ThreadPoolExecutor(max_workers=len(agents)) as pool:
        started = [pool.submit(a.start) for a in agents]
    errors = [e for f in started if (e := f.exception()) is not None]
    if errors:
        for a in agents:
            a.stop()
        raise errors[0]
    peers = {sid: addr for a in agents for sid, addr in a.addresses().items()}
    for a in agents:
        a.connect(peers)
    return agents
