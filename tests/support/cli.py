"""`rdu` as a real process, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

CLI = [sys.executable, "-m", "rdurack.cli.main"]
# Ray on loopback, as the Makefile sets it; no orchestrator address from the caller's
# environment (a test names its own).
ENV = {
    **{k: v for k, v in os.environ.items() if k != "RDURACK_ORCHESTRATOR"},
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}


def rdu(
    *args: str, timeout: float = 120, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`rdu ARGS` in ENV, with `env` over it."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=timeout,
        check=False,
    )


def rdu_json(*args: str) -> Any:
    """Run `rdu ARGS --json`; it must succeed quietly and print exactly one JSON value."""
    r = rdu(*args, "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)
