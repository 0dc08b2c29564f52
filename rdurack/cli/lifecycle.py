"""`rdu up` and `rdu down`: start a local rack (Ray, node agents, the orchestrator) and
stop it again, by the process ids recorded in its state dir."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rdurack.cli.options import PortOpt, StateDirOpt


def up_cmd(
    nodes: Annotated[int, typer.Option(min=1, max=64, help="node agents")] = 2,
    sockets_per_node: Annotated[int, typer.Option(min=1, max=64)] = 8,
    state_dir: StateDirOpt = Path(".state"),
    port: PortOpt = 50051,
    timeout: Annotated[float, typer.Option(min=1, help="seconds to wait for readiness")] = 120,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls", help="TLS everywhere, with a throwaway CA in STATE_DIR/tls (mutual in-rack)"
        ),
    ] = False,
    tokens: Annotated[
        Path | None,
        typer.Option(
            "--tokens", help="a tokens file: the orchestrator requires bearer tokens (tenants)"
        ),
    ] = None,
    time_scale: Annotated[
        float, typer.Option(min=0, help="pacing: wall s per emulated s (0: no pacing)")
    ] = 0.0,
) -> None:
    """Start local Ray, the node agents and the orchestrator; return once all serve."""
    from rdurack.processes import local_rack

    rack = local_rack.up(
        state_dir,
        nodes,
        sockets_per_node,
        port,
        timeout,
        on_ready=lambda name, address: print(f"{name:<14} ready at {address}", flush=True),
        tls=tls,
        tokens=tokens,
        time_scale=time_scale,
    )
    print(
        f"rack up: {nodes} x {sockets_per_node} sockets; orchestrator at {rack.orchestrator}; "
        f"logs in {state_dir / 'logs'}; stop it with: rdu down --state-dir {state_dir}"
    )
    print(f"security: {rack.security()}")


def down_cmd(state_dir: StateDirOpt = Path(".state")) -> None:
    """Stop what rdu up started in the state dir, by the process ids it recorded."""
    from rdurack.processes import local_rack

    for line in local_rack.down(state_dir):
        print(line)
