"""A whole rack on this machine, as `rdu up`, `rdu down` and `rdu demo` run it.

`up` starts child processes (children.py), each `sys.executable -m rdurack.processes...`:
1. the Ray head (`ray_head`);
2. one node agent per node, in parallel, joining that Ray;
3. the orchestrator, given the agents' addresses.

It waits for each one's ready line, with a deadline. Each process writes its stdout and
stderr to `STATE_DIR/logs/<name>.log`. `STATE_DIR/rack.json` (rack_record.py) records
their process ids and arguments, so `down` stops exactly what `up` started, and nothing
else: a recorded pid is signalled only while it is the same process.
Every process gets `RDURACK_TRACE_DIR=STATE_DIR/traces` (unless the environment sets
it; empty turns trace files off), so `rdu trace` and `rdu plot` find each job's spans.

Security: by default everything is plaintext on 127.0.0.1 and the API is open (anyone
on this machine may submit jobs). `tls=True` makes a throwaway rack CA and member
certificate in STATE_DIR/tls (security/certs.py): the orchestrator serves TLS, and node
agents and links are mutual TLS among rack members. `tokens` (a tokens file) makes the
orchestrator require bearer tokens; an admin tenant's token then is what AdminService
(fault injection, `rdu fault`) asks for. Open, anyone on this machine may inject faults.

`serve` (model names) also starts the OpenAI-compatible endpoint, `rdu serve --rack`, on
`serve_port`: an endpoint job per model holds `serve_sockets` sockets, and its tokens
are paced at `time_scale` (real time when the sockets do not pace). With tokens on, the
endpoint would need a token of its own to submit its jobs: `up` refuses the two
together (start `rdu serve --rack --token ...` yourself).

`restart_agent` is the local rack's supervisor: it starts a node agent that died (a
KILL_AGENT fault) again, with the same arguments and port, so the orchestrator finds it
at the address it knows.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rdurack import RAY_ENVIRONMENT
from rdurack.errors import RdurackError
from rdurack.orchestrator.store.jobstore import is_url
from rdurack.processes import children, rack_record
from rdurack.processes.registration import TOKEN_ENV
from rdurack.processes.settings import port_range
from rdurack.security import certs
from rdurack.security.auth import load_tokens
from rdurack.security.tls import (
    DEFAULT_RACK_IDENTITY,
    ENV_CA,
    ENV_CERT,
    ENV_KEY,
    ENV_RACK_IDENTITY,
    ENV_SERVER_NAME,
)
from rdurack.telemetry.file_export import TRACE_DIR_ENV

DEFAULT_PLATFORM = "sn40l-rack16"
DEFAULT_SHAPE = (1, 2, 8)  # racks, nodes a rack, sockets a node of sn40l-rack16
SPEC_FILE = "platform.yaml"
TRACES_DIR = "traces"  # STATE_DIR/traces: the processes' trace files (telemetry/file_export.py)
TLS_DIR = "tls"  # STATE_DIR/tls: `up --tls`'s throwaway CA and member certificate
SECURITY_ENV = (
    *(ENV_CA, ENV_CERT, ENV_KEY, ENV_RACK_IDENTITY, ENV_SERVER_NAME),
    *("RDURACK_TOKENS", TOKEN_ENV),
)
STOP_WAIT_S = 15.0


@dataclass(frozen=True)
class TlsFiles:
    """The rack's CA and the member certificate and key, as `up --tls` writes them in
    STATE_DIR/tls (and `rdu join --tls-dir` takes a copy of)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, tls_dir: Path) -> TlsFiles:
        return cls(tls_dir / certs.CA_FILE, tls_dir / certs.CERT_FILE, tls_dir / certs.KEY_FILE)

    def args(self) -> list[str]:
        """The processes' flags for them."""
        return ["--tls-ca", str(self.ca), "--tls-cert", str(self.cert), "--tls-key", str(self.key)]


def default_state_dir() -> Path:
    """RDURACK_STATE_DIR, else `.state/` under the current directory."""
    return Path(os.environ.get("RDURACK_STATE_DIR") or ".state")


# ------------------------------------------------------------------ starting


def trace_dir(state_dir: Path) -> Path:
    """Where the rack's processes write their trace files: the environment's
    RDURACK_TRACE_DIR when set, else STATE_DIR/traces."""
    return Path(os.environ.get(TRACE_DIR_ENV) or state_dir / TRACES_DIR)


def child_env(state_dir: Path) -> dict[str, str]:
    """The environment of the rack's processes (and of Ray's workers, which inherit it)."""
    # Ray's workers (the socket actors) inherit the environment of the Ray head, so the
    # trace dir reaches every process of the rack this way. Absolute: the children may
    # change directory. A user's own value (even empty: no files) wins.
    traces = {TRACE_DIR_ENV: os.environ.get(TRACE_DIR_ENV, str(trace_dir(state_dir).resolve()))}
    # Security comes from `up`'s own flags only: a client's RDURACK_TLS_CA or
    # RDURACK_TOKENS in this shell must not turn half a server's security on.
    inherited = {k: v for k, v in os.environ.items() if k not in SECURITY_ENV}
    return {**inherited, **RAY_ENVIRONMENT, "PYTHONUNBUFFERED": "1", **traces}


def _spawn(name: str, module: str, args: list[str], logs: Path) -> subprocess.Popen[bytes]:
    return children.spawn(name, module, args, logs, child_env(logs.parent))  # logs: STATE_DIR/logs


def up(
    state_dir: Path,
    nodes: int = 2,
    sockets_per_node: int = 8,
    port: int = 50051,
    timeout_s: float = 120,
    host: str = "127.0.0.1",
    on_ready: Callable[[str, str], None] | None = None,
    tls: bool = False,
    tokens: Path | None = None,
    time_scale: float = 0.0,
    serve: Sequence[str] = (),
    serve_port: int = 8000,
    serve_sockets: int = 8,
    store: str = "",
    local_nodes: int | None = None,
    link_ports: str = "",
    racks: int = 1,
) -> rack_record.RackProcesses:
    """Start the Ray head, `racks` x `nodes` node agents and the orchestrator; return when all
    serve. On failure, stop what was started and raise an RdurackError naming the
    process that failed, with the end of its log. `on_ready(name, address)` is called as
    each becomes ready. `tls`, `tokens`: the module docstring. `time_scale`: the sockets'
    pacing, wall s per emulated s (0: as fast as the machine allows). `store`: the
    orchestrator's job store, a postgresql:// URL or a SQLite path (empty:
    STATE_DIR/jobs.sqlite). `local_nodes`: start agents for nodes 0..local_nodes-1 only;
    the others join from other hosts (`rdu join`, join.py; None: every node here).
    `link_ports`: "LO-HI", where the sockets' link servers bind (empty: any free port).
    `racks`: racks of `nodes` nodes each, joined by the base platform's default spine;
    nodes number across racks (rack r holds nodes r*nodes..), one agent each."""
    if nodes < 1 or sockets_per_node < 1 or racks < 1:
        raise RdurackError("--racks, --nodes and --sockets-per-node must be at least 1")
    total = racks * nodes
    here = total if local_nodes is None else local_nodes
    if not 0 <= here <= total:
        raise RdurackError(f"--local-nodes {here}: the platform has {total} nodes (0..{total})")
    port_range(link_ports, "--link-ports")  # refused before anything starts
    if not 0 <= port <= 65535:
        raise RdurackError(f"--port {port}: not a TCP port (0..65535)")
    if tokens is not None:
        load_tokens(tokens)  # a bad file is refused before anything starts
    if not time_scale >= 0:
        raise RdurackError(f"--time-scale {time_scale}: must be >= 0")
    if serve and tokens is not None:
        raise RdurackError(
            "--serve with --tokens: the endpoint needs a token of its own to submit its jobs; "
            "start it yourself with rdu serve --rack --token TOKEN"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    rack_record.refuse_if_up(state_dir)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    rack = rack_record.RackProcesses(state_dir, DEFAULT_PLATFORM, total, sockets_per_node)
    rack.host = host
    security: list[str] = []
    if tls:
        # Clients on other hosts dial `host`: the certificate names it too.
        hosts = [*certs.LOCAL_HOSTS, *([host] if host not in certs.LOCAL_HOSTS else [])]
        tls_dir = certs.write_rack_set(
            (state_dir / TLS_DIR).resolve(), DEFAULT_RACK_IDENTITY, hosts
        )
        files = TlsFiles.in_dir(tls_dir)
        security = files.args()
        rack.tls_ca = str(files.ca)
    if tokens is not None:
        rack.tokens = str(tokens.resolve())
    spec: list[str] = []
    if (racks, nodes, sockets_per_node) != DEFAULT_SHAPE:
        spec_file = (state_dir / SPEC_FILE).resolve()
        # More than one rack: the base's default spine links them (rack.whatif).
        spec_file.write_text(
            f"# written by rdu up: {racks} racks x {nodes} nodes x {sockets_per_node} sockets\n"
            f"base: {DEFAULT_PLATFORM}\nracks: {racks}\nnodes: {nodes}\n"
            f"node: {{sockets: {sockets_per_node}}}\n"
        )
        spec = ["--spec", str(spec_file)]
    deadline = time.monotonic() + timeout_s
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def started(name: str, proc: subprocess.Popen[bytes], args: list[str]) -> None:
        procs[name] = proc
        rack.started(name, proc.pid, args)

    def ready(found: dict[str, str]) -> None:
        for name, address in found.items():
            rack.addresses[name] = address
            if on_ready is not None:
                on_ready(name, address)
        rack.save()

    try:
        # The head's Ray node takes `host`: each agent attaches to the Ray node of its
        # own --host (actors.start_ray), which on one machine is the head's.
        head = ["--host", host]
        started("ray-head", _spawn("ray-head", "rdurack.processes.ray_head", head, logs), head)
        ready(children.await_ready({"ray-head": (procs["ray-head"], "ray-head")}, logs, deadline))
        agents: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        for i in range(here):
            name = f"node-agent-{i}"
            args = ["--node-index", str(i), "--ray-address", rack.addresses["ray-head"]]
            args += ["--host", host, "--port", "0", "--platform", DEFAULT_PLATFORM, *spec]
            args += [*security, "--time-scale", f"{time_scale:g}"]
            args += ["--link-ports", link_ports] if link_ports else []
            started(name, _spawn(name, "rdurack.processes.node_agent_main", args, logs), args)
            agents[name] = (procs[name], f"node-agent {i}")
        ready(children.await_ready(agents, logs, deadline))
        args = ["--host", host, "--port", str(port), "--state-dir", str(state_dir.resolve())]
        args += ["--platform", DEFAULT_PLATFORM, *spec]
        args += ["--agents", ",".join(rack.addresses[n] for n in agents), *security]
        args += ["--ray-address", rack.addresses["ray-head"]]
        if tokens is not None:
            args += ["--tokens", rack.tokens]
        if store:
            # A file made absolute, as the state dir is: the children may change directory.
            args += ["--store", store if is_url(store) else str(Path(store).resolve())]
        started(
            "orchestrator",
            _spawn("orchestrator", "rdurack.processes.orchestrator_main", args, logs),
            args,
        )
        ready(
            children.await_ready(
                {"orchestrator": (procs["orchestrator"], "orchestrator")}, logs, deadline
            )
        )
        if serve:
            args = ["serve", "--rack", "--address", rack.addresses["orchestrator"]]
            args += [a for m in serve for a in ("--model", m)]
            args += ["--sockets", str(serve_sockets), "--host", host, "--port", str(serve_port)]
            args += ["--time-scale", f"{time_scale or 1.0:g}", *spec]
            if tls:  # trusts the rack's CA, and serves HTTPS with the member certificate
                args += security
            started("endpoint", _spawn("endpoint", "rdurack.cli.main", args, logs), args)
            endpoint = {"endpoint": (procs["endpoint"], "endpoint")}
            ready(children.await_ready(endpoint, logs, deadline))
    except BaseException:  # an error, or Ctrl-C: stop what was started, then re-raise
        down(state_dir)
        raise
    return rack


def restart_agent(state_dir: Path, node: int, timeout_s: float = 60) -> str:
    """Start node agent `node` of the rack `up` recorded again, with its arguments and at
    the address it served (the orchestrator reconnects there), if it is not running;
    its address. Its previous log is kept as `node-agent-N.previous.log`."""
    record = rack_record.read(state_dir)
    if record is None:
        raise RdurackError(f"no rack is up in {state_dir} (no {rack_record.RACK_FILE})")
    name = f"node-agent-{node}"
    args = record.get("args", {}).get(name)
    address = record.get("addresses", {}).get(name)
    if not isinstance(args, list) or not isinstance(address, str):
        raise RdurackError(f"{state_dir / rack_record.RACK_FILE} has no {name} to restart")
    if name in rack_record.live_pids(state_dir):
        return address
    port = address.rsplit(":", 1)[1]
    args = [*args[: args.index("--port") + 1], port, *args[args.index("--port") + 2 :]]
    logs = state_dir / "logs"
    log = logs / f"{name}.log"
    if log.exists():
        log.replace(logs / f"{name}.previous.log")
    proc = _spawn(name, "rdurack.processes.node_agent_main", args, logs)
    record["pids"][name] = proc.pid
    if (started_s := rack_record.start_time(proc.pid)) is not None:
        record.setdefault("started_s", {})[name] = started_s
    rack_record.write(state_dir, record)
    found = children.await_ready(
        {name: (proc, f"node-agent {node}")}, logs, time.monotonic() + timeout_s
    )
    return found[name]


def restart_dead_agents(state_dir: Path, timeout_s: float = 60) -> list[str]:
    """Start again every node agent of the rack in `state_dir` that is not running (the
    local rack's supervisor); their names. No rack there: none."""
    record = rack_record.read(state_dir)
    if record is None:
        return []
    live = rack_record.live_pids(state_dir)
    dead = [n for n in record["pids"] if n.startswith("node-agent-") and n not in live]
    for name in dead:
        restart_agent(state_dir, int(name.rsplit("-", 1)[1]), timeout_s)
    return dead


# ------------------------------------------------------------------ stopping


def down(state_dir: Path, wait_s: float = STOP_WAIT_S) -> list[str]:
    """Stop what `up` recorded in STATE_DIR/rack.json, last started first; one line per
    process. Only recorded pids that are still the processes `up` started are signalled.
    No rack.json: one line saying so."""
    record = rack_record.read(state_dir)
    if record is None:
        return [f"no rack is up in {state_dir} (no {rack_record.RACK_FILE})"]
    started = record.get("started_s", {})
    if not isinstance(started, dict):
        started = {}
    done: list[str] = []
    for name, pid in reversed(list(record["pids"].items())):
        proc = rack_record.ours(pid, started.get(name))
        if proc is None:
            done.append(f"{name} (pid {pid}): not running")
            continue
        done.append(f"{name} (pid {pid}): {children.stop(proc, wait_s)}")
    (state_dir / rack_record.RACK_FILE).unlink(missing_ok=True)
    return done
