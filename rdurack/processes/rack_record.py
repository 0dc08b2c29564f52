"""What `rdu up` started, on disk: `STATE_DIR/rack.json` (`RackProcesses`), and which of
the processes it records still run and are ours.

A recorded pid is ours only while it is the same process: same start time (psutil's
create_time, within a second), "rdurack" in its command line, not a zombie. So `rdu down`
signals exactly what `rdu up` started, and nothing else, even after pids are reused.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from rdurack.errors import RdurackError

RACK_FILE = "rack.json"


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
    host: str = "127.0.0.1"  # the address its processes serve on

    def security(self) -> str:
        """One line: how the rack is protected, and what a client needs."""
        loopback = self.host in ("127.0.0.1", "::1", "localhost")
        where = "loopback (127.0.0.1)" if loopback else f"{self.host}, open to other hosts"
        transport = (
            f"TLS (clients: --tls-ca {self.tls_ca})" if self.tls_ca else f"plaintext on {where}"
        )
        who = "anyone on this machine" if loopback else f"anyone who reaches {self.host}"
        access = (
            f"bearer tokens required (tokens file {self.tokens}; clients: --token)"
            if self.tokens
            else f"unauthenticated: {who} may submit, cancel and inject faults"
        )
        return f"{transport}; {access}"

    args: dict[str, list[str]] = field(default_factory=dict)  # module arguments, by name

    @property
    def orchestrator(self) -> str:
        return self.addresses["orchestrator"]

    def started(self, name: str, pid: int, args: list[str]) -> None:
        """Record a process as soon as it is started, and save: if the starter itself
        dies, `down` still finds every process."""
        self.pids[name] = pid
        self.args[name] = args
        if (started_s := start_time(pid)) is not None:
            self.started_s[name] = started_s
        self.save()

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
            "host": self.host,
        }

    def save(self) -> None:
        write(self.state_dir, self.to_dict())


def write(state_dir: Path, record: dict[str, Any]) -> None:
    path = state_dir / RACK_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)  # atomic: `down` never reads half a file


def read(state_dir: Path) -> dict[str, Any] | None:
    """STATE_DIR/rack.json as written; None when there is none. RdurackError for a file
    that is not a record of `rdu up`."""
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


def ours(pid: Any, started_s: Any = None) -> psutil.Process | None:
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


def start_time(pid: int) -> float | None:
    """When process `pid` started (psutil's create_time, s since the epoch); None if it
    is gone already."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def refuse_if_up(state_dir: Path) -> None:
    """RdurackError if the processes recorded in STATE_DIR still run."""
    if live := live_pids(state_dir):
        names = ", ".join(f"{n} (pid {p})" for n, p in live.items())
        raise RdurackError(f"a rack is already up in {state_dir}: {names}; run rdu down first")


def live_pids(state_dir: Path) -> dict[str, int]:
    """Processes recorded in STATE_DIR/rack.json that still run (and are ours)."""
    record = read(state_dir)
    if record is None:
        return {}
    started = record.get("started_s", {})
    return {
        name: pid
        for name, pid in record["pids"].items()
        if ours(pid, started.get(name)) is not None
    }
