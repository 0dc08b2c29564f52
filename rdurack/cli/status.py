"""`rdu status`: the rack as its orchestrator sees it, one row per socket, and on stderr
what is wrong with it (nodes and sockets down, injected slowdowns)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from rdurack.cli.options import JsonOpt
from rdurack.cli.views import format_seconds, format_size, rack_dict
from rdurack.client.connection import Target
from rdurack.client.rack import RackClient


def status_cmd(*, to: Target, as_json: JsonOpt = False) -> None:
    """The rack: every socket's health, job, emulated clock and memory per tier."""
    with to.channel() as ch:
        data = rack_dict(RackClient(ch).status())
    if as_json:
        print(json.dumps(data))
        return
    table = Table(title=f"{data['platform']} at {to.address}")
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
