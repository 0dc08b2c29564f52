"""A node agent as a process: `python -m rdurack.processes.node_agent_main --node-index 0`.

Settings come from flags, else the environment, as Kubernetes pods set it
(`NodeAgentSettings`, read as processes/settings.py says); a value it cannot take is one
line on stderr, exit code 2:

    --node-index   RDURACK_NODE_INDEX   which rack node this agent runs (0-based)
    --platform     RDURACK_PLATFORM     platform preset (default sn40l-rack16)
    --spec         RDURACK_SPEC         what-if YAML applied to the platform
    --ray-address  RAY_ADDRESS          Ray cluster to join (empty: start a local one)
    --host         RDURACK_HOST         address to serve on (default 127.0.0.1); also
                                        the Ray node it joins (its host's, `ray start
                                        --node-ip-address`), unless a wildcard
    --port         RDURACK_AGENT_PORT   NodeAgentService port (0: a free port)
    --link-ports   RDURACK_LINK_PORTS   LO-HI: the sockets' link servers bind the first
                                        free ports of this range, for a firewall between
                                        hosts (default: any free port)
    --time-scale   RDURACK_TIME_SCALE   wall seconds per emulated second (0: no pacing)
    --tls-ca, --tls-cert, --tls-key     mutual TLS among rack members, for NodeAgentService
                   RDURACK_TLS_CA, _CERT, _KEY  and every socket's links (default: plaintext)
    --tls-rack-identity RDURACK_TLS_RACK_IDENTITY  the rack members' certificate name
    --health-port  RDURACK_HEALTH_PORT  plaintext grpc.health.v1 only, for Kubernetes
                                        probes (default: off)
    --register-with RDURACK_REGISTER_WITH  orchestrator addresses (every replica's,
                                        comma-separated) to register this node with, as
                                        an agent joining from another host (`rdu join`)
                                        does; again every few seconds (registration.py)
                   RDURACK_TOKEN        the admin bearer token RegisterNode then needs
                                        when the orchestrator requires tokens (the
                                        environment only: not in the process list)

It prints one line `node-agent <index> ready at <host:port>` once every socket serves.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import ray
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rdurack.api.node_agent_service import SERVICE, NodeAgentService
from rdurack.api.server import Server
from rdurack.errors import RdurackError
from rdurack.node_agent.actors import start_ray
from rdurack.node_agent.agent import NodeAgent
from rdurack.processes.registration import TOKEN_ENV, WILDCARDS, Registration
from rdurack.processes.settings import TlsSettings, env, load, port_range
from rdurack.processes.stop_signal import StopSignal
from rdurack.rack.whatif import load_platform
from rdurack.telemetry import setup

# --help prints the module docstring (its table of flags and variables).
HELP = __doc__


class NodeAgentSettings(TlsSettings):
    """A node agent's settings: the module docstring's table."""

    model_config = SettingsConfigDict(
        cli_prog_name="python -m rdurack.processes.node_agent_main",
        json_schema_extra={"description": HELP},
    )

    node_index: int = Field(0, ge=0)
    platform: str = "sn40l-rack16"
    spec: Path | None = None
    ray_address: str = Field("", json_schema_extra=env("RAY_ADDRESS"))
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, json_schema_extra=env("RDURACK_AGENT_PORT"))
    time_scale: float = Field(0.0, ge=0)  # wall s per emulated s
    health_port: int | None = Field(None, ge=0, le=65535)
    register_with: str = ""  # comma-separated orchestrator addresses
    link_ports: str = ""  # LO-HI; `link_port_range` reads it

    @property
    def link_port_range(self) -> range | None:
        return port_range(self.link_ports, "--link-ports")

    @property
    def orchestrators(self) -> list[str]:
        return [a.strip() for a in self.register_with.split(",") if a.strip()]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        args = load(NodeAgentSettings, argv)
        platform = load_platform(args.platform, args.spec)
        tls = args.tls()
        if tls is not None:
            tls.key_pair()  # mutual TLS needs its own certificate: refuse now, not later
        if args.orchestrators and args.host in WILDCARDS:
            raise RdurackError(
                f"--register-with with --host {args.host}: the orchestrator needs this host's "
                "own address to reach the agent at"
            )
        agent = NodeAgent(
            args.node_index,
            platform,
            time_scale=args.time_scale,
            host=args.host,
            tls=tls,
            link_ports=args.link_port_range,
        )
    except (RdurackError, ValueError) as e:
        print(f"node-agent: {e}", file=sys.stderr)
        return 2
    setup.configure(f"rdurack-node-agent-{args.node_index}")
    start_ray(args.ray_address or None, host=args.host)
    agent.start()
    service = NodeAgentService(agent, on_kill=_exit(args.node_index))
    try:
        server = Server(
            [(SERVICE, service.add_to)],
            host=args.host,
            port=args.port,
            tls=tls,
            rack_peers=tls is not None,
            health_port=args.health_port,
        )
    except OSError as e:  # a port taken or not ours: one line, as the orchestrator says
        print(f"node-agent: {e}", file=sys.stderr)
        agent.stop()
        ray.shutdown()
        return 2
    service.address = server.address
    if server.health_address is not None:
        print(f"node-agent {args.node_index} health (plaintext) at {server.health_address}")
    print(f"node-agent {args.node_index} ready at {server.address}", flush=True)
    registration = None
    if args.orchestrators:
        token = os.environ.get(TOKEN_ENV) or None
        registration = Registration(
            args.orchestrators, args.node_index, server.address, tls=tls, token=token
        ).start()

    StopSignal().install().wait()
    if registration is not None:
        registration.stop()
    server.stop()
    agent.stop()
    ray.shutdown()
    setup.shutdown()
    return 0


# The exit code of an agent ended by a KILL_AGENT fault (EX_SOFTWARE, sysexits.h).
KILLED_EXIT_CODE = 70


def _exit(node_index: int) -> Callable[[], None]:
    """A KILL_AGENT fault: end the process at once, as a crash would (no clean-up, no
    span export). Ray then ends the socket actors this process owned."""

    def kill() -> None:
        print(f"node-agent {node_index} killed by fault injection", file=sys.stderr, flush=True)
        os._exit(KILLED_EXIT_CODE)

    return kill


if __name__ == "__main__":
    sys.exit(main())
