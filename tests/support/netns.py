"""Hosts on one machine: Linux network namespaces joined by a bridge (issue 21).

`Hosts(n)` makes n namespaces `rdh-<tag>-0`.. with addresses 10.77.0.1.. (/24) on a
bridge that lives in a namespace of its own (`rdh-<tag>-sw`), so the machine's own
network is never touched, and tears them down with every process still in them.
Every namespace has its own loopback, ports and interfaces, hence several harnesses can
use the same addresses at once; they share the machine's pid namespace and file system
(`ray.init` sees every host's raylet in the process list: actors.start_ray's `host`).

`unavailable()` says why namespaces cannot be made here (not Linux, not root, no `ip`,
or `ip netns add` refused, as in an unprivileged container): the tests skip with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

PREFIX = "rdh-"  # every namespace this module makes; `ip netns list | grep rdh-` finds leaks
SUBNET = "10.77.0"  # hosts are SUBNET.1, SUBNET.2, ... (/24)
IP_TIMEOUT_S = 10.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check
    )


def unavailable() -> str | None:
    """Why network namespaces cannot be made on this machine; None if they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces with"
    if os.geteuid() != 0:
        return "making network namespaces needs root (ip netns add)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


class Hosts:
    """`count` hosts as network namespaces on one bridge; a context manager (module
    docstring). Host i is namespace `names[i]` at `addresses[i]`."""

    def __init__(self, count: int, tag: str = "") -> None:
        if not 1 <= count <= 250:
            raise ValueError(f"count must be 1..250, got {count}")
        # The pid by default: two test processes never collide; short, as a namespace
        # name needs not be, but it shows in `ip netns list` when hunting leaks.
        self.tag = tag or str(os.getpid())
        self.switch = f"{PREFIX}{self.tag}-sw"
        self.names = [f"{PREFIX}{self.tag}-{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]

    # ------------------------------------------------------------------ lifecycle

    def up(self) -> Hosts:
        """Make the namespaces, the bridge and one veth pair per host. On failure,
        remove what was made and raise (subprocess.CalledProcessError, with ip's
        stderr)."""
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
                _ip("netns", "add", name)
                # Both ends are made in their namespaces: no name in the machine's own.
                _ip("link", "add", "eth0", "netns", name, "type", "veth",
                    "peer", "name", f"p{i}", "netns", self.switch)  # fmt: skip
                _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
        except BaseException:
            self.down()
            raise
        return self

    def down(self, wait_s: float = 5.0) -> None:
        """Stop every process left in the hosts (SIGTERM, then SIGKILL after `wait_s`)
        and delete the namespaces; never raises for what is already gone."""
        for i in range(len(self.names)):
            self.kill(i, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while any(self.pids(i) for i in range(len(self.names))):
            if time.monotonic() > deadline:
                for i in range(len(self.names)):
                    self.kill(i, signal.SIGKILL)
                break
            time.sleep(0.1)
        for name in [*self.names, self.switch]:
            _ip("netns", "del", name, check=False)

    def __enter__(self) -> Hosts:
        return self.up()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.down()

    # ------------------------------------------------------------------ processes

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """`argv` as run on host `host`."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def run(
        self, host: int, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on host `host` to its end (subprocess.run's keywords; text)."""
        return subprocess.run(self.command(host, argv), text=True, **kwargs)

    def spawn(self, host: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start `argv` on host `host` (subprocess.Popen's keywords; text)."""
        return subprocess.Popen(self.command(host, argv), text=True, **kwargs)

    def pids(self, host: int) -> list[int]:
        """The processes in host `host`'s namespace (all started through this harness,
        or by them)."""
        found = _ip("netns", "pids", self.names[host], check=False)
        return [int(p) for p in found.stdout.split()] if found.returncode == 0 else []

    def kill(self, host: int, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every process of host `host` (SIGKILL: the host crashes); their pids."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, sig)
        return pids
