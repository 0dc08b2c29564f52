"""A machine joining a rack that runs elsewhere, as `rdu join` runs it (docs/scale-out.md).

The head machine runs `rdu up --head --host ADDR` (local_rack.py): the Ray head, the
orchestrator and, if asked, some node agents. On each other machine `join`:

1. asks the orchestrator (`--head`, its address) for the rack (GetRack): the Ray cluster
   to join, the platform, and which nodes have no agent yet (or a dead one);
2. starts a Ray worker node on this host (`ray start --address RAY --block`, a child
   process like the others; Ray needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 to join a
   cluster, for that process only);
3. starts one node agent per node taken, serving on this host's address, on this Ray
   node, each registering with the orchestrator (registration.py);
4. returns once the orchestrator shows every one of them registered and healthy.

Like `up`, it records the processes in STATE_DIR/rack.json: `rdu down` on this machine
stops exactly them (agents first, then the Ray node, whose SIGTERM handler stops its
raylet). Security as on the head: `tls` names the rack's CA and member certificate
(copied from the head's STATE_DIR/tls), `token` an admin's token when the orchestrator
requires tokens.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

import grpc

from rdurack.api.server import channel
from rdurack.errors import RdurackError
from rdurack.processes import children, rack_record
from rdurack.processes.local_rack import DEFAULT_PLATFORM, SPEC_FILE, TlsFiles, child_env, down
from rdurack.processes.registration import TOKEN_ENV, WILDCARDS
from rdurack.processes.settings import port_range
from rdurack.security.tls import TlsConfig, tls_from
from rdurack.v1 import rack_pb2, rack_pb2_grpc

RAY_NODE = "ray-node"  # the Ray worker node's name in rack.json and logs/
RAY_STARTED = "Ray runtime started"  # `ray start`'s line once its node serves
POLL_S = 0.25
CALL_TIMEOUT_S = 30.0  # a GetRack: the orchestrator answers from memory and its store
# RegisterNode answers that asking again will not change (registration.py prints the
# gRPC code's name); UNAVAILABLE and DEADLINE_EXCEEDED may pass.
FINAL_REFUSALS = ("UNAUTHENTICATED", "PERMISSION_DENIED", "FAILED_PRECONDITION", "INVALID_ARGUMENT")


def join(
    state_dir: Path,
    head: str,
    host: str,
    nodes: int = 1,
    timeout_s: float = 120,
    *,
    tls: TlsFiles | None = None,
    token: str = "",
    time_scale: float = 0.0,
    link_ports: str = "",
    on_ready: Callable[[str, str], None] | None = None,
) -> rack_record.RackProcesses:
    """Join the rack whose orchestrator serves at `head` with `nodes` node agents on
    this host (`host`, an address the head's machines reach); what was started. On
    failure, stop what was started and raise an RdurackError saying why.
    `link_ports`: "LO-HI", where the sockets' link servers bind (empty: any free port)."""
    if host in WILDCARDS:
        raise RdurackError(
            f"--host {host!r}: give this host's own address, which the head's machines reach it at"
        )
    if nodes < 1:
        raise RdurackError(f"--nodes {nodes}: at least 1")
    port_range(link_ports, "--link-ports")  # refused before anything starts
    state_dir.mkdir(parents=True, exist_ok=True)
    rack_record.refuse_if_up(state_dir)
    target = _Head(head, token or None, tls_from(tls.ca) if tls is not None else None)
    rack = _rack(target)
    if not rack.ray_address or not rack.platform_spec:
        raise RdurackError(
            f"the orchestrator at {head} takes no agents from other hosts: "
            "it did not say its Ray cluster (start it with rdu up --head)"
        )
    taken = free_nodes(rack, nodes, head)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    spec_file = (state_dir / SPEC_FILE).resolve()
    spec_file.write_text(f"# the platform of the rack at {head} (GetRack)\n{rack.platform_spec}")
    per_node = max((len(n.sockets) for n in rack.nodes), default=0)
    record = rack_record.RackProcesses(state_dir, rack.platform, len(rack.nodes), per_node)
    record.host = host
    record.addresses["head"] = head
    if tls is not None:
        record.tls_ca = str(tls.ca)
    env = child_env(state_dir)
    deadline = time.monotonic() + timeout_s
    try:
        args = ["start", "--address", rack.ray_address, "--node-ip-address", host, "--block"]
        args += ["--num-cpus", "0", "--disable-usage-stats", "--temp-dir", ray_temp_dir(state_dir)]
        # Only this process joins Ray across hosts: with 0, `ray start --address` aborts.
        ray_env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
        proc = children.spawn(RAY_NODE, "ray.scripts.scripts", args, logs, ray_env)
        record.started(RAY_NODE, proc.pid, args)
        children.await_line(RAY_NODE, proc, logs, RAY_STARTED, deadline)
        if on_ready is not None:
            on_ready(RAY_NODE, host)
        agents: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        agent_env = {**env, TOKEN_ENV: token} if token else env
        for node in taken:
            name = f"node-agent-{node}"
            args = ["--node-index", str(node), "--ray-address", rack.ray_address]
            args += ["--host", host, "--port", "0", "--platform", DEFAULT_PLATFORM]
            args += ["--spec", str(spec_file), "--register-with", head]
            args += ["--time-scale", f"{time_scale:g}", *(tls.args() if tls else [])]
            args += ["--link-ports", link_ports] if link_ports else []
            proc = children.spawn(name, "rdurack.processes.node_agent_main", args, logs, agent_env)
            record.started(name, proc.pid, args)
            agents[name] = (proc, f"node-agent {node}")
        for name, address in children.await_ready(agents, logs, deadline).items():
            record.addresses[name] = address
            if on_ready is not None:
                on_ready(name, address)
        record.save()
        mine = {n: record.addresses[f"node-agent-{n}"] for n in taken}
        await_registered(target, mine, deadline, logs)
    except BaseException:  # an error, or Ctrl-C: stop what was started, then re-raise
        down(state_dir)
        raise
    return record


def ray_temp_dir(state_dir: Path) -> str:
    """Ray's temp dir for this state dir's node: its own, since hosts made of network
    namespaces share one file system, and short, since Ray's unix socket paths under it
    must fit 108 bytes. "rdurack" in it marks the process as ours (rack_record.ours)."""
    digest = sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"/tmp/rdurack-ray-{digest}"


@dataclass(frozen=True)
class _Head:
    """The rack's orchestrator as `join` calls it (client/ is a layer `processes/` does
    not import: docs/architecture.md)."""

    address: str
    token: str | None
    tls: TlsConfig | None


def _rack(target: _Head) -> rack_pb2.RackStatus:
    try:
        with channel(target.address, tls=target.tls, token=target.token) as ch:
            stub = rack_pb2_grpc.RackServiceStub(ch)
            return stub.GetRack(rack_pb2.GetRackRequest(), timeout=CALL_TIMEOUT_S).rack
    except grpc.RpcError as e:
        why = e.details() if hasattr(e, "details") else str(e)
        raise RdurackError(f"the orchestrator at {target.address} did not answer: {why}") from None


def free_nodes(rack: rack_pb2.RackStatus, count: int, head: str) -> list[int]:
    """The first `count` nodes with no agent, then those whose agent is down; the
    orchestrator still refuses a node whose agent answers (RegisterNode)."""
    empty = [n.index for n in rack.nodes if not n.agent_address]
    down_ = [n.index for n in rack.nodes if n.agent_address and not n.healthy]
    free = [*empty, *down_]
    if len(free) < count:
        listed = ", ".join(map(str, free)) or "none"
        raise RdurackError(
            f"the rack at {head} has {len(free)} nodes to join (free: {listed}); asked for {count}"
        )
    return free[:count]


def await_registered(
    target: _Head, agents: dict[int, str], deadline: float, logs: Path | None = None
) -> None:
    """Wait until the orchestrator shows node i healthy at agents[i], for every i. An
    agent whose log (in `logs`) says the orchestrator refused it for good (a token that
    is not an admin's, a node another agent serves) ends the wait at once, saying so."""
    waiting = dict(agents)
    while waiting:
        for node in waiting:
            if logs is not None and (refused := _refusal(logs / f"node-agent-{node}.log")):
                raise RdurackError(refused)
        rack = _rack(target)
        for n in rack.nodes:
            if waiting.get(n.index) == n.agent_address and n.healthy:
                del waiting[n.index]
        if not waiting:
            return
        if time.monotonic() > deadline:
            seen = {n.index: (n.agent_address, n.health_reason) for n in rack.nodes}
            late = {i: seen.get(i) for i in waiting}
            raise RdurackError(
                f"the orchestrator at {target.address} did not show nodes "
                f"{sorted(waiting)} registered before the deadline: {late}"
            )
        time.sleep(POLL_S)


def _refusal(log: Path) -> str | None:
    """The agent's line saying the orchestrator refused it for good, if any."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "not registered with" in line and any(c in line for c in FINAL_REFUSALS):
            return line.strip()
    return None
