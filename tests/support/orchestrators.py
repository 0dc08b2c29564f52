"""Orchestrators as processes in tests (`python -m rdurack.processes.orchestrator_main`,
output in files), for the tests that kill one: and the jobs they submit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rdurack.v1 import job_pb2
from tests.support.control import PLATFORM, kernel, prefill
from tests.support.ports import free_port


class Process:
    """`python -m rdurack.processes.orchestrator_main` with its output in files."""

    def __init__(
        self,
        state_dir: Path,
        agents: list[str],
        log_dir: Path,
        name: str,
        store: str = "",
        args: Sequence[str] = (),
    ) -> None:
        self.out = log_dir / f"{name}.out"
        self.err = log_dir / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rdurack.processes.orchestrator_main",
                    "--port",
                    str(free_port()),
                    "--host",
                    "127.0.0.1",
                    "--state-dir",
                    str(state_dir),
                    "--agents",
                    ",".join(agents),
                    "--platform",
                    PLATFORM,
                    *(["--store", store] if store else []),
                    *args,
                ],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def ready(self, timeout_s: float = 60.0) -> str:
        """The address from the `orchestrator ready at HOST:PORT` line."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("orchestrator ready at "):
                    return line.rsplit(" ", 1)[1].strip()
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"orchestrator not ready (exit {self.proc.poll()}): {self.err.read_text()[-2000:]}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def restart_specs() -> list[job_pb2.JobSpec]:
    """20 small jobs: 1- and 2-socket prefills, every fifth a long decode."""
    specs = []
    for i in range(20):
        if i % 5 == 4:
            specs.append(
                kernel(sockets=2, tokens=4096, sequence_length=128, name=f"restart-{i}-decode")
            )
        else:
            specs.append(prefill(1 + i % 2, name=f"restart-{i}"))
    return specs
