"""The orchestrator as a process: `python -m rdurack.processes.orchestrator_main`.

Settings come from flags, else the environment (`OrchestratorSettings`, read as
processes/settings.py says); a value it cannot take is one line on stderr, exit code 2:

    --agents      RDURACK_AGENTS             node agent addresses, node 0 first, comma-separated;
                                             fewer than the platform's nodes: the other
                                             nodes' agents join from other hosts (`rdu
                                             join`, RackService.RegisterNode)
    --ray-address RDURACK_RAY_ADDRESS        the rack's Ray cluster, told to agents that
                                             join (GetRack; default: none given)
    --state-dir   RDURACK_STATE_DIR          where the job store lives without --store
                                             (DIR/jobs.sqlite; default .state)
    --store       RDURACK_STORE              the job store: a SQLite file path, or a
                                             postgresql:// URL, a database several
                                             orchestrators may share (its password in
                                             PGPASSWORD or ~/.pgpass, not the URL)
    --host        RDURACK_HOST               address to serve on (default 127.0.0.1)
    --port        RDURACK_ORCHESTRATOR_PORT  JobService/RackService port (default 50051)
    --platform    RDURACK_PLATFORM           platform preset (default sn40l-rack16)
    --spec        RDURACK_SPEC               what-if YAML applied to the platform
    --recovery    RDURACK_RECOVERY           jobs running at a crash: retry (default) or fail
    --checkpoint-dir RDURACK_CHECKPOINT_DIR  training checkpoints, a directory per job, on
                                             storage every node agent sees (default
                                             STATE_DIR/checkpoints)
    --metrics-port RDURACK_METRICS_PORT      serve rack metrics for Prometheus at
                                             http://HOST:PORT/metrics (default: off)
    --tokens      RDURACK_TOKENS             tokens file: bearer tokens -> tenants, quotas
                                             (default: none, the API is open)
    --tls-ca, --tls-cert, --tls-key          TLS: the rack CA, this server's certificate
                  RDURACK_TLS_CA, _CERT, _KEY and key (default: none, plaintext); the
                                             same files make its channels to the node
                                             agents mutual TLS
    --tls-rack-identity RDURACK_TLS_RACK_IDENTITY  the rack members' certificate name
    --health-port RDURACK_HEALTH_PORT        plaintext grpc.health.v1 only, for
                                             Kubernetes probes (default: off)
    --replica     RDURACK_REPLICA            this replica's name among orchestrators
                                             sharing one store, unique among them
                                             (default HOST:PORT, its address)
    --lease-ttl   RDURACK_LEASE_TTL          seconds a silent leader keeps the lease
                                             before another replica takes over (default 5)
    --dead-after  RDURACK_DEAD_AFTER         seconds a node agent or socket may be silent
                                             before it counts as down (default 2; raise it
                                             on a machine loaded beyond its cores)

It prints one line saying whether it serves TLS and requires tokens, one saying whether
it leads or follows (docs/control-plane.md, "Replicas"), and one line
`orchestrator ready at <host:port>` once it serves.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rdurack.api import metrics as rack_metrics
from rdurack.api.job_service import serve_api
from rdurack.api.node_gateway import GrpcNodeGateway
from rdurack.api.rack_service import Joining
from rdurack.api.server import security_notice
from rdurack.errors import RdurackError
from rdurack.orchestrator.fault_injector import FaultInjector
from rdurack.orchestrator.health import DEAD_AFTER_S
from rdurack.orchestrator.leadership import LEASE_TTL_S
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.processes.settings import TlsSettings, env, load
from rdurack.processes.stop_signal import StopSignal
from rdurack.rack.whatif import load_platform
from rdurack.security.auth import Authenticator
from rdurack.telemetry import setup

# --help prints the module docstring (its table of flags and variables).
HELP = __doc__

# gRPC server threads. Every open WatchJob stream holds one for its whole life, so the
# pool must outnumber the streams clients keep open, or later calls queue until a stream
# ends. `make bench`'s 100 WatchJob streams (one run each, loaded machine): with 16
# threads the first event p99 was 2.4 s and the delivery p99 2.2 s; with 256, 0.6 s and
# 0.14 s.
SERVER_WORKERS = 256


class OrchestratorSettings(TlsSettings):
    """The orchestrator's settings: the module docstring's table."""

    model_config = SettingsConfigDict(
        cli_prog_name="python -m rdurack.processes.orchestrator_main",
        json_schema_extra={"description": HELP},
    )

    agents: str = ""  # comma-separated; `agent_addresses` splits them
    ray_address: str = ""
    state_dir: Path = Path(".state")
    store: str = ""  # empty: STATE_DIR/jobs.sqlite
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535, json_schema_extra=env("RDURACK_ORCHESTRATOR_PORT"))
    platform: str = "sn40l-rack16"
    spec: Path | None = None
    recovery: Literal["retry", "fail"] = "retry"
    checkpoint_dir: Path | None = None
    metrics_port: int | None = Field(None, ge=0, le=65535)
    tokens: Path | None = None
    health_port: int | None = Field(None, ge=0, le=65535)
    replica: str = ""  # empty: `replica_name`
    lease_ttl: float = Field(LEASE_TTL_S, gt=0)
    dead_after: float = Field(DEAD_AFTER_S, gt=0)

    @property
    def replica_name(self) -> str:
        """The replica's name: --replica, else its address; with port 0 (a free one,
        not known yet) its process id stands in for the port."""
        return self.replica or f"{self.host}:{self.port or f'pid{os.getpid()}'}"

    @property
    def agent_addresses(self) -> list[str]:
        return [a.strip() for a in self.agents.split(",") if a.strip()]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        args = load(OrchestratorSettings, argv)
        agents = args.agent_addresses
        platform = load_platform(args.platform, args.spec)
        if len(agents) > platform.nodes_total:
            raise RdurackError(
                f"--agents: {platform.name} has {platform.nodes_total} nodes; got {len(agents)} "
                "agent addresses"
            )
        spec_text = _spec_for_joiners(args.platform, args.spec)
        tls = args.tls()
        if tls is not None:
            tls.key_pair()  # a server needs its own certificate: refuse now, not later
        auth = Authenticator.from_file(args.tokens)
        store = JobStore(args.store or args.state_dir / "jobs.sqlite")
    except (RdurackError, ValueError, OSError) as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return 2
    setup.configure("rdurack-orchestrator")
    gateway = GrpcNodeGateway(agents, tls=tls, platform=platform)
    checkpoints = args.checkpoint_dir or args.state_dir / "checkpoints"
    orchestrator = Orchestrator(
        store,
        gateway,
        platform,
        recovery=args.recovery,
        checkpoint_dir=checkpoints.resolve(),
        quotas=auth.quotas(),
        replica=args.replica_name,
        lease_ttl_s=args.lease_ttl,
        dead_after_s=args.dead_after,
    )
    recovered = orchestrator.start()
    try:
        server = serve_api(
            orchestrator,
            auth,
            faults=FaultInjector(gateway, platform),
            host=args.host,
            port=args.port,
            tls=tls,
            health_port=args.health_port,
            workers=SERVER_WORKERS,
            joining=Joining(gateway.register, args.ray_address, spec_text),
        )
    except OSError as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        orchestrator.stop()
        return 2
    if len(agents) < platform.nodes_total:
        print(
            f"orchestrator: nodes {len(agents)}..{platform.nodes_total - 1} wait for their "
            f"agents to join: rdu join --head {server.address}",
            flush=True,
        )
    if recovered:
        print(f"orchestrator recovered {len(recovered)} jobs", flush=True)
    if orchestrator.leading:
        print(f"orchestrator {args.replica_name} leads", flush=True)
    else:  # another replica, or this one's predecessor under another name, holds it
        leader = orchestrator.elector.leader
        print(
            f"orchestrator {args.replica_name} follows {leader}: it takes over once {leader} "
            f"stops renewing the lease (within {orchestrator.elector.takeover_bound_s:g} s)",
            flush=True,
        )
    metrics = None
    if args.metrics_port is not None:
        metrics = rack_metrics.serve(orchestrator, args.host, args.metrics_port)
        print(f"orchestrator metrics at {metrics.url}", flush=True)
    print(f"orchestrator: {security_notice(args.host, tls is not None, auth)}", flush=True)
    if server.health_address is not None:
        print(f"orchestrator health (plaintext) at {server.health_address}", flush=True)
    # What start-up made (modules, models, the servers) lives as long as the process:
    # frozen out of the collector's reach, a full collection no longer walks it. Under a
    # stream of submissions those collections stopped every thread for 20-40 ms each,
    # a dozen times a minute: the longest waits of SubmitJob and WatchJob
    # (docs/control-plane.md, "Latency").
    gc.freeze()
    print(f"orchestrator ready at {server.address}", flush=True)
    StopSignal().install().wait()
    if metrics is not None:
        metrics.shutdown()
    server.stop()
    orchestrator.stop()
    gateway.close()
    store.close()
    setup.shutdown()
    return 0


def _spec_for_joiners(preset: str, spec: Path | None) -> str:
    """The platform as a what-if YAML that names its base preset, for agents that join
    from other hosts (they load it as `--spec`, whatever their own --platform)."""
    text = spec.read_text(encoding="utf-8") if spec is not None else ""
    raw = yaml.safe_load(text) if text else None
    if isinstance(raw, dict) and "base" in raw:
        return text
    return f"base: {preset}\n{text}"


if __name__ == "__main__":
    sys.exit(main())
