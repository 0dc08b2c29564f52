"""`rdu fault`: inject faults into a running rack and heal them, through the
orchestrator's AdminService. On a rack with a tokens file it takes an admin tenant's
token (`--token`, `--token-file`), like every client command; the open local default
takes none. docs/faults.md tells what each does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rdurack.cli.options import JsonOpt, StateDirOpt
from rdurack.client.admin import AdminClient, fault_dict, kind_name, wait_healthy
from rdurack.client.connection import Target
from rdurack.errors import InvalidRequest
from rdurack.processes import local_rack
from rdurack.v1 import fault_pb2

# Wall seconds `heal` waits for restarted agents to show healthy in GetRack.
AGENT_BACK_S = 60.0

SocketArg = Annotated[str, typer.Argument(help="e.g. rdu-n0-s3")]
OneEndArg = Annotated[str, typer.Argument(help="one end, e.g. rdu-n0-s1")]
OtherEndArg = Annotated[str, typer.Argument(help="the other end, e.g. rdu-n1-s1")]


def _run(to: Target, as_json: bool, inject: Callable[[AdminClient], fault_pb2.Fault]) -> None:
    with to.channel() as ch:
        fault = inject(AdminClient(ch))
    _show([fault], as_json)


def _show(faults: list[fault_pb2.Fault], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"faults": [fault_dict(f) for f in faults]}))
        return
    for f in faults:
        print(f"{f.id}  {kind_name(f):<12} {f.description}")


def _socket(value: str) -> str:
    return value.strip()


def kill_socket_cmd(
    socket: SocketArg,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Kill a socket actor: its jobs fail fast and are retried elsewhere; it stays dead
    until healed."""
    _run(to, as_json, lambda a: a.kill_socket(_socket(socket)))


def kill_agent_cmd(
    node: Annotated[int, typer.Argument(min=0, help="node index")],
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Kill a node agent process and its socket actors (rdu fault heal restarts it on a
    local rack)."""
    _run(to, as_json, lambda a: a.kill_agent(node))


def slow_cmd(
    socket: SocketArg,
    factor: Annotated[float, typer.Argument(min=1.0, help="kernels take this many x longer")],
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Slow a socket: its kernels take FACTOR times longer (emulated time)."""
    _run(to, as_json, lambda a: a.slow(_socket(socket), factor))


def drop_link_cmd(
    socket_a: OneEndArg,
    socket_b: OtherEndArg,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Drop every transfer over the link between two sockets, both directions."""
    _run(to, as_json, lambda a: a.drop_link(socket_a, socket_b))


def delay_link_cmd(
    socket_a: OneEndArg,
    socket_b: OtherEndArg,
    extra_latency_ns: Annotated[
        int, typer.Argument(min=1, help="extra emulated latency per transfer, ns")
    ],
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Delay every transfer over the link between two sockets (emulated latency)."""
    _run(to, as_json, lambda a: a.delay_link(socket_a, socket_b, extra_latency_ns))


def partition_cmd(
    node_a: Annotated[int, typer.Argument(min=0)] = 0,
    node_b: Annotated[int, typer.Argument(min=0)] = 1,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Cut every link between two nodes (default 0 and 1)."""
    if node_a == node_b:
        raise InvalidRequest(f"a partition cuts two nodes apart; both are {node_a}")
    _run(to, as_json, lambda a: a.partition(node_a, node_b))


def heal_cmd(
    fault_id: Annotated[str, typer.Argument(help="the fault to end; none: every fault")] = "",
    *,
    to: Target,
    state_dir: StateDirOpt = Path(".state"),
    as_json: JsonOpt = False,
) -> None:
    """End a fault, or every fault: links up, sockets at speed, killed socket actors
    restarted. On a local rack (rdu up) it also restarts killed node agents."""
    restarted_agents = local_rack.restart_dead_agents(state_dir) if not fault_id else []
    if restarted_agents:
        nodes = [int(n.rsplit("-", 1)[1]) for n in restarted_agents]
        with to.channel() as ch:
            wait_healthy(ch, nodes, AGENT_BACK_S)
    with to.channel() as ch:
        reply = AdminClient(ch).heal(fault_id)
    if as_json:
        print(
            json.dumps(
                {
                    "healed": [fault_dict(f) for f in reply.healed],
                    "restarted_sockets": list(reply.restarted_socket_ids),
                    "restarted_agents": restarted_agents,
                }
            )
        )
        return
    for name in restarted_agents:
        print(f"restarted {name}")
    for f in reply.healed:
        print(f"healed {f.id}: {f.description}")
    for sid in reply.restarted_socket_ids:
        print(f"restarted socket {sid}")
    if not (reply.healed or reply.restarted_socket_ids or restarted_agents):
        print("nothing to heal")


def list_cmd(*, to: Target, as_json: JsonOpt = False) -> None:
    """The faults in force."""
    with to.channel() as ch:
        faults = AdminClient(ch).faults()
    if not faults and not as_json:
        print("no faults in force")
        return
    _show(faults, as_json)
