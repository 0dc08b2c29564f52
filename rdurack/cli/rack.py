"""The rack as a whole: `rdu up` starts a local rack (Ray, node agents, the orchestrator),
`rdu down` stops it by the process ids recorded in its state dir, and `rdu status` shows
it as its orchestrator sees it, one row per socket, and on stderr what is wrong with it
(nodes and sockets down, injected slowdowns)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rdurack.cli.options import JsonOpt, PortOpt, StateDirOpt, TokenOpt
from rdurack.cli.views import format_seconds, format_size, rack_dict
from rdurack.client.connection import Target
from rdurack.client.rack import RackClient
from rdurack.rack.spec import MAX_RACKS

LinkPortsOpt = Annotated[
    str,
    typer.Option(
        "--link-ports",
        envvar="RDURACK_LINK_PORTS",
        help="LO-HI: the sockets' link servers bind the first free ports of this range "
        "(default: any free port)",
    ),
]
TimeScaleOpt = Annotated[
    float, typer.Option(min=0, help="pacing: wall s per emulated s (0: no pacing)")
]


def up_cmd(
    nodes: Annotated[int, typer.Option(min=1, max=64, help="nodes a rack, one agent each")] = 2,
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
    time_scale: TimeScaleOpt = 0.0,
    serve: Annotated[
        list[str] | None,
        typer.Option(
            "--serve",
            help="also serve this model on an OpenAI-compatible endpoint (rdu serve --rack); "
            "repeat for several",
        ),
    ] = None,
    serve_port: Annotated[
        int, typer.Option(min=0, max=65535, help="the endpoint's port (0: any free one)")
    ] = 8000,
    serve_sockets: Annotated[int, typer.Option(min=1, help="sockets each --serve model holds")] = 8,
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="RDURACK_STORE",
            help="the job store: a postgresql:// URL (its password in PGPASSWORD or "
            "~/.pgpass), or a SQLite file; default STATE_DIR/jobs.sqlite",
        ),
    ] = "",
    host: Annotated[
        str,
        typer.Option(
            "--host",
            envvar="RDURACK_HOST",
            help="the address every process serves on (default loopback); with --head, "
            "one the other hosts reach",
        ),
    ] = "127.0.0.1",
    head: Annotated[
        bool,
        typer.Option(
            "--head",
            help="a rack other hosts join (rdu join --head ORCHESTRATOR): start the "
            "agents of --local-nodes nodes here, the others join",
        ),
    ] = False,
    local_nodes: Annotated[
        int | None,
        typer.Option(min=0, help="with --head: node agents to start here, nodes 0.. (default 0)"),
    ] = None,
    link_ports: LinkPortsOpt = "",
    racks: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_RACKS,
            help="racks of --nodes nodes, joined by the default spine (nodes number across racks)",
        ),
    ] = 1,
) -> None:
    """Start local Ray, the node agents and the orchestrator (and with --serve the
    OpenAI-compatible endpoint on them); return once all serve. With --head, other
    hosts' agents join the rack with rdu join."""
    from rdurack.errors import RdurackError
    from rdurack.processes import local_rack

    if local_nodes is not None and not head:
        raise RdurackError("--local-nodes needs --head (the other nodes join from other hosts)")

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
        serve=serve or (),
        serve_port=serve_port,
        serve_sockets=serve_sockets,
        store=store,
        host=host,
        local_nodes=(local_nodes or 0) if head else None,
        link_ports=link_ports,
        racks=racks,
    )
    shape = (
        f"{racks} racks x {nodes} x {sockets_per_node}"
        if racks > 1
        else f"{nodes} x {sockets_per_node}"
    )
    print(
        f"rack up: {shape} sockets; orchestrator at {rack.orchestrator}; "
        f"logs in {state_dir / 'logs'}; stop it with: rdu down --state-dir {state_dir}"
    )
    if head:
        here = local_nodes or 0
        print(
            f"nodes {here}..{racks * nodes - 1} wait for agents from other hosts; on each run: "
            f"rdu join --head {rack.orchestrator} --host THAT_HOST [--nodes N]"
        )
    print(f"security: {rack.security()}")


def join_cmd(
    head: Annotated[
        str, typer.Option("--head", help="the rack's orchestrator (host:port), rdu up --head's")
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host", envvar="RDURACK_HOST", help="this host's address, which the head reaches"
        ),
    ],
    nodes: Annotated[int, typer.Option(min=1, help="node agents to start here")] = 1,
    state_dir: StateDirOpt = Path(".state"),
    timeout: Annotated[float, typer.Option(min=1, help="seconds to wait for readiness")] = 120,
    token: TokenOpt = "",
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            "--tls-dir",
            help="a TLS rack: the head's STATE_DIR/tls (ca.crt, tls.crt, tls.key), copied here",
        ),
    ] = None,
    time_scale: TimeScaleOpt = 0.0,
    link_ports: LinkPortsOpt = "",
) -> None:
    """Join a rack that runs on another host (rdu up --head there): a Ray worker node
    and node agents on this host, which register with its orchestrator. rdu down
    --state-dir stops them."""
    from rdurack.processes import join, local_rack

    tls = local_rack.TlsFiles.in_dir(tls_dir) if tls_dir is not None else None
    rack = join.join(
        state_dir,
        head,
        host,
        nodes,
        timeout,
        tls=tls,
        token=token,
        time_scale=time_scale,
        link_ports=link_ports,
        on_ready=lambda name, address: print(f"{name:<14} ready at {address}", flush=True),
    )
    taken = sorted(n for n in rack.addresses if n.startswith("node-agent-"))
    print(
        f"joined the rack at {head}: {', '.join(taken)} on {host}; logs in "
        f"{state_dir / 'logs'}; stop them with: rdu down --state-dir {state_dir}"
    )


def down_cmd(state_dir: StateDirOpt = Path(".state")) -> None:
    """Stop what rdu up started in the state dir, by the process ids it recorded."""
    from rdurack.processes import local_rack

    for line in local_rack.down(state_dir):
        print(line)


def status_cmd(*, to: Target, as_json: JsonOpt = False) -> None:
    """The rack: every socket's health, job, emulated clock and memory per tier."""
    with to.channel() as ch:
        data = rack_dict(RackClient(ch).status())
    if as_json:
        print(json.dumps(data))
        return
    control = data["control_plane"]
    leads = "no leader"
    if control["leader"]:
        leads = f"leader {control['leader']}, term {control['term']}"
    table = Table(title=f"{data['platform']} at {to.address} ({leads})")
    for col in ("node", "socket", "health", "job", "clock", "HBM used/peak/cap."):
        table.add_column(col, no_wrap=col in ("socket", "health"))
    table.add_column("DDR used")
    table.add_column("SRAM used")
    empty = {"used_bytes": 0, "peak_bytes": 0, "capacity_bytes": 0}
    for s in data["sockets"]:
        hbm = s["tiers"].get("hbm", empty)
        health = s["health"]
        clock_ns = s["emulated_clock_ns"]
        table.add_row(
            str(s["node"]),
            s["id"],
            f"[green]{health}[/]" if health == "HEALTHY" else f"[red]{health}[/]",
            s["job"] or "",
            format_seconds(clock_ns / 1e9) if clock_ns else "0",
            "/".join(format_size(hbm[k]) for k in ("used_bytes", "peak_bytes", "capacity_bytes")),
            format_size(s["tiers"].get("ddr", empty)["used_bytes"]),
            format_size(s["tiers"].get("sram", empty)["used_bytes"]),
        )
    Console().print(table)
    err = Console(stderr=True)
    for n in data["nodes"]:
        if not n["healthy"]:
            err.print(f"[red]node {n['index']}: {n['health_reason'] or 'not healthy'}[/]")
    for s in data["sockets"]:
        if s["health"] != "HEALTHY" and s["health_reason"]:
            err.print(f"[red]{s['id']}: {s['health_reason']}[/]")
        elif s["slowdown"] != 1.0:
            err.print(f"[yellow]{s['id']}: {s['slowdown']:g}x slower (injected fault)[/]")
