"""The hosts-as-network-namespaces harness (tests/support/netns.py) itself: two hosts
reach each other over the bridge, each has only its own address, and nothing is left
behind. Skipped, with the reason, where namespaces cannot be made."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.netns import PREFIX, Hosts, unavailable

pytestmark = pytest.mark.integration

WHY = unavailable()
needs_netns = pytest.mark.skipif(WHY is not None, reason=WHY or "")

# Host 1 echoes one line; host 0 sends it. Each side prints what it saw.
SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 7777)); s.listen(1)
print("listening", flush=True)
c, peer = s.accept(); print(peer[0], c.recv(16).decode(), flush=True)
"""
CLIENT = """
import socket, sys
socket.create_connection((sys.argv[1], 7777), timeout=5).sendall(b"hello")
"""
BIND = """
import socket, sys
try:
    socket.socket().bind((sys.argv[1], 0)); print("bound")
except OSError as e:
    print("refused", e.errno)
"""


@needs_netns
def test_two_hosts_talk_over_the_bridge_and_are_cleaned_up() -> None:
    hosts = Hosts(2, tag=f"t{id(object()) % 10000}")
    with hosts:
        server = hosts.spawn(
            1, [sys.executable, "-c", SERVER, hosts.addresses[1]], stdout=subprocess.PIPE
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "listening"
        hosts.run(0, [sys.executable, "-c", CLIENT, hosts.addresses[1]], check=True, timeout=30)
        assert server.stdout.readline().split() == [hosts.addresses[0], "hello"]
        server.wait(timeout=10)
        # Host 0 has its own address and not host 1's: a server there cannot pose as 1.
        bind = [sys.executable, "-c", BIND]
        own = hosts.run(0, [*bind, hosts.addresses[0]], capture_output=True, timeout=30)
        other = hosts.run(0, [*bind, hosts.addresses[1]], capture_output=True, timeout=30)
        assert own.stdout.split() == ["bound"]
        assert other.stdout.split() == ["refused", "99"]  # EADDRNOTAVAIL
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in listed.split() if n.startswith(f"{PREFIX}{hosts.tag}-")]


def test_the_reason_to_skip_is_one_line_or_none() -> None:
    assert WHY is None or (WHY and "\n" not in WHY)
