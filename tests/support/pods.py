"""A pod's container as a local process: its addresses, ports and paths rewritten for
this machine (tests/k8s/test_smoke*.py; what changes from a pod: test_smoke.py's
docstring)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from tests.support.manifests import Obj, env_of
from tests.support.ports import free_port

SPEC_DIR = "/etc/rdurack"
TLS_DIR = "/etc/rdurack-tls"
TOKENS_DIR = "/etc/rdurack-tokens"
ENDPOINT_TOKEN_DIR = "/etc/rdurack-endpoint-token"
STATE_DIR = "/var/lib/rdurack/state"
CHECKPOINTS = "/var/lib/rdurack/checkpoints"
# Kubernetes' $(VAR) in a command, an argument or an env value (earlier variables).
EXPAND = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# `ray start` on a worker node (no --head) waits for SIGTERM; anything else is real Ray.
RAY_SHIM = """#!/bin/bash
if [ "$1" = start ] && [[ " $* " != *" --head "* ]]; then
  echo "ray shim: standing in for: ray $*"
  sleep infinity & trap 'kill $!; exit 0' TERM INT; wait $!
  exit 0
fi
exec {ray} "$@"
"""


class Localizer:
    """Rewrites a pod's addresses, ports and paths for a process on this machine."""

    def __init__(self, tmp: Path, ray_tmp: Path) -> None:
        self.ray_tmp = ray_tmp
        ports = (6379, 50061, 50062, 50051, 50052, 8000)  # Ray, agent, orchestrator, endpoint
        self.ports = {p: free_port() for p in ports}
        self.paths = {
            # Longest first: /etc/rdurack is a prefix of the Secrets' mount paths.
            TLS_DIR: tmp / "etc-rdurack-tls",
            TOKENS_DIR: tmp / "etc-rdurack-tokens",
            ENDPOINT_TOKEN_DIR: tmp / "etc-rdurack-endpoint-token",
            SPEC_DIR: tmp / "etc-rdurack",
            STATE_DIR: tmp / "state",
            CHECKPOINTS: tmp / "checkpoints",
        }
        self.shims = tmp / "bin"
        self.shims.mkdir()
        ray = self.shims / "ray"
        ray.write_text(RAY_SHIM.format(ray=Path(sys.executable).parent / "ray"))
        ray.chmod(0o755)

    def text(self, value: str) -> str:
        ray, agent, orchestrator = self.ports[6379], self.ports[50061], self.ports[50051]
        value = value.replace("rdurack-ray-head:6379", f"127.0.0.1:{ray}")
        value = value.replace("rdurack-orchestrator:50051", f"127.0.0.1:{orchestrator}")
        value = re.sub(
            r"rdurack-node-agent-0\.rdurack-node-agent:50061", f"127.0.0.1:{agent}", value
        )
        value = value.replace("--port=6379", f"--port={ray}")
        if value == "0.0.0.0":  # every address of the pod: here, loopback only
            return "127.0.0.1"
        for pod_path, local in self.paths.items():
            value = value.replace(pod_path, str(local))
        return {str(p): str(local) for p, local in self.ports.items()}.get(value, value)

    def env(self, container: Obj) -> dict[str, str]:
        path = os.pathsep.join([str(self.shims), str(Path(sys.executable).parent)])
        env = {**os.environ, "PATH": f"{path}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        defined: dict[str, str] = {}  # $(VAR) expands to a variable defined above it
        for name, item in env_of(container).items():
            if name == "OTEL_EXPORTER_OTLP_ENDPOINT":
                continue  # no collector here
            if "value" in item:
                value = EXPAND.sub(lambda m: defined.get(m[1], m[0]), str(item["value"]))
                env[name] = defined[name] = self.text(value)
                continue
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            downward = {
                "status.podIP": "127.0.0.1",
                "metadata.labels['apps.kubernetes.io/pod-index']": "0",
            }
            assert field in downward, f"{container['name']}: no local stand-in for {field}"
            env[name] = defined[name] = downward[field]
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback on this machine
        env["RAY_TMPDIR"] = str(self.ray_tmp)
        return env

    def command(self, container: Obj, env: dict[str, str]) -> list[str]:
        """The container's command and args, with Kubernetes' $(VAR) expansion."""
        argv = [*container.get("command", []), *container.get("args", [])]
        return [self.text(EXPAND.sub(lambda m: env.get(m[1], m[0]), a)) for a in argv]
