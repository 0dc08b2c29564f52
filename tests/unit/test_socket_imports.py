"""What a socket actor's process imports at its start. Sixteen of them start in every
bring-up, two at a time on 2 cores, so what most sockets never use stays out until it
is used: torch (the training stack, node_agent/socket.py) and cryptography (TLS
certificates, security/tls.py). Checked in a fresh interpreter, since this one may have
either loaded already."""

from __future__ import annotations

import subprocess
import sys

LEFT_OUT = ("torch", "cryptography")


def test_a_socket_actor_starts_without_torch_or_cryptography() -> None:
    loaded = f"sorted({{m.split('.')[0] for m in sys.modules}} & {set(LEFT_OUT)!r})"
    code = f"import sys, rdurack.node_agent.actors; print({loaded})"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", f"a socket actor imports {done.stdout.strip()}"
