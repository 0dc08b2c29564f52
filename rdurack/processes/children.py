"""The local rack's child processes one at a time: start one (`spawn`, `sys.executable
-m MODULE`, its output in `LOGS/<name>.log`), wait for its ready line (`await_ready`),
and stop one (`stop`: SIGTERM, then SIGKILL after a while).

Output goes to a file, not a pipe: the processes outlive the `rdu up` that started them.
Each starts in a new session, so Ctrl-C in the terminal reaches `rdu`, which then stops
the rack in order, rather than every process at once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from rdurack.errors import RdurackError

TAIL_LINES = 15


def spawn(
    name: str, module: str, args: list[str], logs: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start `python -m module args` with environment `env`, writing to LOGS/name.log."""
    with (logs / f"{name}.log").open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` non-blank lines of a log."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) or "(empty log)"


def ready_address(log: Path, prefix: str) -> str | None:
    """The address of the first `<prefix> ready at ADDRESS` line of a log, if any."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(prefix) and " ready at " in line:
            return line.rsplit(" ", 1)[1].strip()
    return None


def await_ready(
    procs: Mapping[str, tuple[subprocess.Popen[bytes], str]], logs: Path, deadline: float
) -> dict[str, str]:
    """Wait until every process (name -> (process, ready-line prefix)) printed its ready
    line; name -> address. RdurackError, with the end of its log, for a process that
    exits first or is not ready by `deadline` (monotonic s)."""
    ready: dict[str, str] = {}
    while len(ready) < len(procs):
        for name, (proc, prefix) in procs.items():
            if name in ready:
                continue
            address = ready_address(logs / f"{name}.log", prefix)
            if address is not None:
                ready[name] = address
            elif proc.poll() is not None:
                raise failed(name, logs, f"exited with code {proc.returncode}")
        if len(ready) < len(procs):
            if time.monotonic() > deadline:
                late = next(n for n in procs if n not in ready)
                raise failed(late, logs, "was not ready before the deadline")
            time.sleep(0.05)
    return ready


def await_line(
    name: str, proc: subprocess.Popen[bytes], logs: Path, needle: str, deadline: float
) -> None:
    """Wait until LOGS/name.log has a line containing `needle` (a process that prints
    no `ready at` line of ours, such as `ray start`); RdurackError as `await_ready`."""
    log = logs / f"{name}.log"
    while True:
        try:
            if needle in log.read_text(errors="replace"):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise failed(name, logs, f"exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise failed(name, logs, "was not ready before the deadline")
        time.sleep(0.05)


def failed(name: str, logs: Path, what: str) -> RdurackError:
    log = logs / f"{name}.log"
    return RdurackError(f"{name} {what}; the end of {log}:\n{tail(log)}")


def stop(proc: psutil.Process, wait_s: float) -> str:
    """SIGTERM, then SIGKILL if it has not exited after `wait_s`; what happened."""
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
