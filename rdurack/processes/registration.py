"""A node agent that joined from another host keeps its node: `Registration` tells the
orchestrator (every replica it was given) where the agent serves, again every
REGISTER_EVERY_S, so that an orchestrator that restarted, or a replica that took over,
finds the agent without anyone running `rdu join` again. The same address again is no
change to the orchestrator (RackService.RegisterNode).

`register_once` is one round, which tests drive step by step; `start` runs rounds on a
daemon thread until `stop`. Each round's outcome per orchestrator is printed only when
it changes ("registered", or why not), so a log says what happened without a line every
few seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import grpc

from rdurack.api.server import channel
from rdurack.security.tls import TlsConfig
from rdurack.v1 import rack_pb2, rack_pb2_grpc

# Seconds between rounds: how long a restarted orchestrator may not know the agent.
# Its health watcher already marks a silent node down after a few seconds; a round
# costs one small unary call per orchestrator.
REGISTER_EVERY_S = 5.0
CALL_TIMEOUT_S = 10.0
# The admin bearer token RegisterNode needs where the orchestrator requires tokens: the
# environment only, never a flag (the process list shows flags to everyone).
TOKEN_ENV = "RDURACK_TOKEN"
# Addresses that serve on every interface: no one can be told to dial them.
WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})


class Registration:
    """Node `node`'s agent at `address` registering with `orchestrators` (host:port
    each); `tls` (a rack member's files) and `token` (an admin's) as the orchestrator
    requires them. `say` gets one line per change of outcome."""

    def __init__(
        self,
        orchestrators: Sequence[str],
        node: int,
        address: str,
        *,
        tls: TlsConfig | None = None,
        token: str | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        every_s: float = REGISTER_EVERY_S,
    ) -> None:
        self.node, self.address, self.every_s, self.say = node, address, every_s, say
        self._channels = {
            o: channel(o, tls=tls, rack=tls is not None, token=token) for o in orchestrators
        }
        self.outcome: dict[str, str] = {}  # orchestrator -> "registered" or why not
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"register-node-{node}", daemon=True)

    def register_once(self) -> dict[str, str]:
        """One round: register with every orchestrator; the outcome per orchestrator."""
        for orchestrator, ch in self._channels.items():
            try:
                request = rack_pb2.RegisterNodeRequest(index=self.node, agent_address=self.address)
                rack_pb2_grpc.RackServiceStub(ch).RegisterNode(request, timeout=CALL_TIMEOUT_S)
                outcome = "registered"
            except grpc.RpcError as e:
                code = e.code().name if hasattr(e, "code") else "UNKNOWN"
                outcome = f"{code}: {e.details() if hasattr(e, 'details') else e}"
            if self.outcome.get(orchestrator) != outcome:
                self.outcome[orchestrator] = outcome
                if outcome == "registered":
                    self.say(f"node-agent {self.node} registered with {orchestrator}")
                else:
                    self.say(
                        f"node-agent {self.node}: not registered with {orchestrator}: {outcome}"
                    )
        return dict(self.outcome)

    def start(self) -> Registration:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.register_once()
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(CALL_TIMEOUT_S + 1)
        for ch in self._channels.values():
            ch.close()
