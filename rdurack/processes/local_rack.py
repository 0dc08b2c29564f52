"""A whole rack on this machine, as `rdu up`, `rdu down` and `rdu demo` run it.

`up` starts child processes, each `sys.executable -m rdurack.services...`:
1. the Ray head (`ray_head`);
2. one node agent per node, in parallel, joining that Ray;
3. the orchestrator, given the agents' addresses.

It waits for each one's ready line, with a deadline. Each process writes its stdout and
stderr to `STATE_DIR/logs/<name>.log` (a file, not a pipe: the processes outlive the
`rdu up` that started them). `STATE_DIR/rack.json` records their process ids, so
`down` stops exactly what `up` started, and nothing else: a recorded pid is signalled
only while it is the same process (same start time, "rdurack" in its command line).
Every process gets `RDURACK_TRACE_DIR=STATE_DIR/traces` (unless the environment sets
it; empty turns trace files off), so `rdu trace` and `rdu plot` find each job's spans.

Security: by default everything is plaintext on 127.0.0.1 and the API is open (anyone
on this machine may submit jobs). `tls=True` makes a throwaway rack CA and member
certificate in STATE_DIR/tls (security/certs.py): the orchestrator serves TLS, and node
agents and links are mutual TLS among rack members. `tokens` (a tokens file) makes the
orchestrator require bearer tokens; an admin tenant's token then is what AdminService
(fault injection, `rdu fault`) asks for. Open, anyone on this machine may inject faults.

`restart_agent` is the local rack's supervisor: it starts a node agent that died (a
KILL_AGENT fault) again, with the same arguments and port, so the orchestrator finds it
at the address it knows.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from rdurack import RAY_ENVIRONMENT
from rdurack.errors import RdurackError
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
DEFAULT_SHAPE = (2, 8)  # nodes, sockets per node of sn40l-rack16
RACK_FILE = "rack.json"
SPEC_FILE = "platform.yaml"
TRACES_DIR = "traces"  # STATE_DIR/traces: the processes' trace files (telemetry/file_export.py)
TLS_DIR = "tls"  # STATE_DIR/tls: `up --tls`'s throwaway CA and member certificate
SECURITY_ENV = (ENV_CA, ENV_CERT, ENV_KEY, ENV_RACK_IDENTITY, ENV_SERVER_NAME, "RDURACK_TOKENS")
STOP_WAIT_S = 15.0
TAIL_LINES = 15


def default_state_dir() -> Path:
    """RDURACK_STATE_DIR, else `.state/` under the current directory."""
    return Path(os.environ.get("RDURACK_STATE_DIR") or ".state")


@dataclass
class RackProcesses:
    """What `up` started: process ids and addresses by name, in start order."""

    state_dir: Path
    platform: str
    nodes: int
    sockets_per_node: int
    pids: dict[str, int] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    started_s: dict[str, float] = field(default_factory=dict)  # psutil create_time
    tls_ca: str = ""  # the CA clients must trust; "" when plaintext
    tokens: str = ""  # the tokens file the orchestrator checks; "" when open

    def security(self) -> str:
        """One line: how the rack is protected, and what a client needs."""
        transport = (
            f"TLS (clients: --tls-ca {self.tls_ca})"
            if self.tls_ca
            else "plaintext on loopback (127.0.0.1)"
        )
        access = (
            f"bearer tokens required (tokens file {self.tokens}; clients: --token)"
            if self.tokens
            else "unauthenticated: anyone on this machine may submit, cancel and inject faults"
        )
        return f"{transport}; {access}"

    args: dict[str, list[str]] = field(default_factory=dict)  # module arguments, by name

    @property
    def orchestrator(self) -> str:
        return self.addresses["orchestrator"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "nodes": self.nodes,
            "sockets_per_node": self.sockets_per_node,
            "pids": self.pids,
            "addresses": self.addresses,
            "started_s": self.started_s,
            "args": self.args,
            "logs": str(self.state_dir / "logs"),
            "tls_ca": self.tls_ca,
            "tokens": self.tokens,
        }

    def save(self) -> None:
        _write(self.state_dir, self.to_dict())


# ------------------------------------------------------------------ starting


def trace_dir(state_dir: Path) -> Path:
    """Where the rack's processes write their trace files: the environment's
    RDURACK_TRACE_DIR when set, else STATE_DIR/traces."""
    return Path(os.environ.get(TRACE_DIR_ENV) or state_dir / TRACES_DIR)


def _env(state_dir: Path) -> dict[str, str]:
    # Ray's workers (the socket actors) inherit the environment of the Ray head, so the
    # trace dir reaches every process of the rack this way. Absolute: the children may
    # change directory. A user's own value (even empty: no files) wins.
    traces = {TRACE_DIR_ENV: os.environ.get(TRACE_DIR_ENV, str(trace_dir(state_dir).resolve()))}
    # Security comes from `up`'s own flags only: a client's RDURACK_TLS_CA or
    # RDURACK_TOKENS in this shell must not turn half a server's security on.
    inherited = {k: v for k, v in os.environ.items() if k not in SECURITY_ENV}
    return {**inherited, **RAY_ENVIRONMENT, "PYTHONUNBUFFERED": "1", **traces}


def _spawn(name: str, module: str, args: list[str], logs: Path) -> subprocess.Popen[bytes]:
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        # A new session: Ctrl-C in the terminal reaches `rdu`, which then stops the rack
        # in order, rather than every process at once.
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(logs.parent),  # logs is STATE_DIR/logs
            start_new_session=True,
        )


def _tail(log: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) or "(empty log)"


def _ready_address(log: Path, prefix: str) -> str | None:
    """The address of the first `<prefix> ready at ADDRESS` line of a log, if any."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(prefix) and " ready at " in line:
            return line.rsplit(" ", 1)[1].strip()
    return None


def _await_ready(
    procs: dict[str, tuple[subprocess.Popen[bytes], str]], logs: Path, deadline: float
) -> dict[str, str]:
    """Wait until every process printed its ready line; name -> address."""
    ready: dict[str, str] = {}
    while len(ready) < len(procs):
        for name, (proc, prefix) in procs.items():
            if name in ready:
                continue
            address = _ready_address(logs / f"{name}.log", prefix)
            if address is not None:
                ready[name] = address
            elif proc.poll() is not None:
                raise _failed(name, logs, f"exited with code {proc.returncode}")
        if len(ready) < len(procs):
            if time.monotonic() > deadline:
                late = next(n for n in procs if n not in ready)
                raise _failed(late, logs, "was not ready before the deadline")
            time.sleep(0.05)
    return ready


def _failed(name: str, logs: Path, what: str) -> RdurackError:
    log = logs / f"{name}.log"
    return RdurackError(f"{name} {what}; the end of {log}:\n{_tail(log)}")


def live_pids(state_dir: Path) -> dict[str, int]:
    """Processes recorded in STATE_DIR/rack.json that still run (and are ours)."""
    record = _read(state_dir)
    if record is None:
        return {}
    started = record.get("started_s", {})
    return {
        name: pid
        for name, pid in record["pids"].items()
        if _ours(pid, started.get(name)) is not None
    }


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
) -> RackProcesses:
    """Start the Ray head, `nodes` node agents and the orchestrator; return when all
    serve. On failure, stop what was started and raise an RdurackError naming the
    process that failed, with the end of its log. `on_ready(name, address)` is called as
    each becomes ready. `tls`, `tokens`: the module docstring. `time_scale`: the sockets'
    pacing, wall s per emulated s (0: as fast as the machine allows)."""
    if nodes < 1 or sockets_per_node < 1:
        raise RdurackError("--nodes and --sockets-per-node must be at least 1")
    if not 0 <= port <= 65535:
        raise RdurackError(f"--port {port}: not a TCP port (0..65535)")
    if tokens is not None:
        load_tokens(tokens)  # a bad file is refused before anything starts
    if not time_scale >= 0:
        raise RdurackError(f"--time-scale {time_scale}: must be >= 0")
    state_dir.mkdir(parents=True, exist_ok=True)
    if live := live_pids(state_dir):
        names = ", ".join(f"{n} (pid {p})" for n, p in live.items())
        raise RdurackError(f"a rack is already up in {state_dir}: {names}; run rdu down first")
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    rack = RackProcesses(state_dir, DEFAULT_PLATFORM, nodes, sockets_per_node)
    security: list[str] = []
    if tls:
        tls_dir = certs.write_rack_set((state_dir / TLS_DIR).resolve(), DEFAULT_RACK_IDENTITY)
        security = ["--tls-ca", str(tls_dir / certs.CA_FILE)]
        security += ["--tls-cert", str(tls_dir / certs.CERT_FILE)]
        security += ["--tls-key", str(tls_dir / certs.KEY_FILE)]
        rack.tls_ca = str(tls_dir / certs.CA_FILE)
    if tokens is not None:
        rack.tokens = str(tokens.resolve())
    spec: list[str] = []
    if (nodes, sockets_per_node) != DEFAULT_SHAPE:
        spec_file = (state_dir / SPEC_FILE).resolve()
        spec_file.write_text(
            f"# written by rdu up: {nodes} nodes x {sockets_per_node} sockets\n"
            f"base: {DEFAULT_PLATFORM}\nnodes: {nodes}\nnode: {{sockets: {sockets_per_node}}}\n"
        )
        spec = ["--spec", str(spec_file)]
    deadline = time.monotonic() + timeout_s
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def started(name: str, proc: subprocess.Popen[bytes], args: list[str]) -> None:
        procs[name] = proc
        rack.args[name] = args
        rack.pids[name] = proc.pid
        with contextlib.suppress(psutil.Error):
            rack.started_s[name] = psutil.Process(proc.pid).create_time()
        rack.save()  # at once: if `up` itself dies, `down` still finds every process

    def ready(found: dict[str, str]) -> None:
        for name, address in found.items():
            rack.addresses[name] = address
            if on_ready is not None:
                on_ready(name, address)
        rack.save()

    try:
        started("ray-head", _spawn("ray-head", "rdurack.processes.ray_head", [], logs), [])
        ready(_await_ready({"ray-head": (procs["ray-head"], "ray-head")}, logs, deadline))
        agents: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        for i in range(nodes):
            name = f"node-agent-{i}"
            args = ["--node-index", str(i), "--ray-address", rack.addresses["ray-head"]]
            args += ["--host", host, "--port", "0", "--platform", DEFAULT_PLATFORM, *spec]
            args += [*security, "--time-scale", f"{time_scale:g}"]
            started(name, _spawn(name, "rdurack.processes.node_agent_main", args, logs), args)
            agents[name] = (procs[name], f"node-agent {i}")
        ready(_await_ready(agents, logs, deadline))
        args = ["--host", host, "--port", str(port), "--state-dir", str(state_dir.resolve())]
        args += ["--platform", DEFAULT_PLATFORM, *spec]
        args += ["--agents", ",".join(rack.addresses[n] for n in agents), *security]
        if tokens is not None:
            args += ["--tokens", rack.tokens]
        started(
            "orchestrator",
            _spawn("orchestrator", "rdurack.processes.orchestrator_main", args, logs),
            args,
        )
        ready(
            _await_ready({"orchestrator": (procs["orchestrator"], "orchestrator")}, logs, deadline)
        )
    except BaseException:  # an error, or Ctrl-C: stop what was started, then re-raise
        down(state_dir)
        raise
    return rack


def restart_agent(state_dir: Path, node: int, timeout_s: float = 60) -> str:
    """Start node agent `node` of the rack `up` recorded again, with its arguments and at
    the address it served (the orchestrator reconnects there), if it is not running;
    its address. Its previous log is kept as `node-agent-N.previous.log`."""
    record = _read(state_dir)
    if record is None:
        raise RdurackError(f"no rack is up in {state_dir} (no {RACK_FILE})")
    name = f"node-agent-{node}"
    args = record.get("args", {}).get(name)
    address = record.get("addresses", {}).get(name)
    if not isinstance(args, list) or not isinstance(address, str):
        raise RdurackError(f"{state_dir / RACK_FILE} has no {name} to restart")
    if name in live_pids(state_dir):
        return address
    port = address.rsplit(":", 1)[1]
    args = [*args[: args.index("--port") + 1], port, *args[args.index("--port") + 2 :]]
    logs = state_dir / "logs"
    log = logs / f"{name}.log"
    if log.exists():
        log.replace(logs / f"{name}.previous.log")
    proc = _spawn(name, "rdurack.processes.node_agent_main", args, logs)
    record["pids"][name] = proc.pid
    with contextlib.suppress(psutil.Error):
        record.setdefault("started_s", {})[name] = psutil.Process(proc.pid).create_time()
    _write(state_dir, record)
    found = _await_ready({name: (proc, f"node-agent {node}")}, logs, time.monotonic() + timeout_s)
    return found[name]


def restart_dead_agents(state_dir: Path, timeout_s: float = 60) -> list[str]:
    """Start again every node agent of the rack in `state_dir` that is not running (the
    local rack's supervisor); their names. No rack there: none."""
    record = _read(state_dir)
    if record is None:
        return []
    live = live_pids(state_dir)
    dead = [n for n in record["pids"] if n.startswith("node-agent-") and n not in live]
    for name in dead:
        restart_agent(state_dir, int(name.rsplit("-", 1)[1]), timeout_s)
    return dead


def _write(state_dir: Path, record: dict[str, Any]) -> None:
    path = state_dir / RACK_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)  # atomic: `down` never reads half a file


# ------------------------------------------------------------------ stopping


def _read(state_dir: Path) -> dict[str, Any] | None:
    path = state_dir / RACK_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RdurackError(f"cannot read {path}: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("pids"), dict):
        raise RdurackError(f"{path}: not a record of rdu up (no 'pids')")
    return record


def _ours(pid: Any, started_s: Any = None) -> psutil.Process | None:
    """The process `pid` if it still runs and is one rdu up started: "rdurack" in its
    command line and, when recorded, the same start time (a reused pid is not ours)."""
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if not any("rdurack" in part for part in proc.cmdline()):
            return None
        if isinstance(started_s, int | float) and abs(proc.create_time() - started_s) > 1.0:
            return None
        return proc
    except psutil.Error:
        return None


def _stop(proc: psutil.Process, wait_s: float) -> str:
    try:
        proc.terminate()
        try:
            proc.wait(wait_s)
            return "stopped"
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            return f"killed (no exit {wait_s:g} s after SIGTERM)"
    except psutil.NoSuchProcess:
        return "stopped"
    except psutil.Error as e:
        return f"could not be stopped: {e}"


def down(state_dir: Path, wait_s: float = STOP_WAIT_S) -> list[str]:
    """Stop what `up` recorded in STATE_DIR/rack.json, last started first; one line per
    process. Only recorded pids that are still the processes `up` started are signalled.
    No rack.json: one line saying so."""
    record = _read(state_dir)
    if record is None:
        return [f"no rack is up in {state_dir} (no {RACK_FILE})"]
    started = record.get("started_s", {})
    if not isinstance(started, dict):
        started = {}
    done: list[str] = []
    for name, pid in reversed(list(record["pids"].items())):
        proc = _ours(pid, started.get(name))
        if proc is None:
            done.append(f"{name} (pid {pid}): not running")
            continue
        done.append(f"{name} (pid {pid}): {_stop(proc, wait_s)}")
    (state_dir / RACK_FILE).unlink(missing_ok=True)
    return done
