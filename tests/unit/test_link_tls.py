"""Links with TLS: members of the rack transfer; a peer without the rack certificate is
refused, whether it has no certificate, one of another CA, or one of the rack's CA for
something else."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from rdurack.errors import LinkFailure
from rdurack.node_agent.links.endpoint import LinkEndpoint
from rdurack.node_agent.links.sending import CHUNK_BYTES
from rdurack.v1 import link_pb2, link_pb2_grpc
from tests.support.certs import RackCerts

A, B = "rdu-n0-s0", "rdu-n0-s1"


@pytest.fixture
def members(rack_certs: RackCerts) -> Iterator[tuple[LinkEndpoint, LinkEndpoint]]:
    a = LinkEndpoint(A, tls=rack_certs.member)
    b = LinkEndpoint(B, clock_ns=lambda: 77, tls=rack_certs.member)
    a.connect({B: b.address})
    b.connect({A: a.address})
    yield a, b
    a.close()
    b.close()


def test_members_transfer_over_mutual_tls(members: tuple[LinkEndpoint, LinkEndpoint]) -> None:
    a, b = members
    data = np.arange(3 * CHUNK_BYTES // 4, dtype=np.float32)  # several chunks: the stream
    sent = a.send(B, "t", 0, 0, 10, data.nbytes, data.data, "float32", data.shape)
    assert sent == data.nbytes
    got = b.receive("t", 0, A, timeout_s=5)
    assert np.array_equal(np.frombuffer(got.payload(5.0) or b"", np.float32), data)
    assert a.send(B, "t", 1, 0, 10, 64, None) == 0  # timing only: the unary call
    assert a.ping(B) == (B, 77)


@pytest.mark.parametrize("who", ["plaintext", "foreign", "stranger"])
def test_a_peer_without_the_rack_certificate_is_refused(
    members: tuple[LinkEndpoint, LinkEndpoint], rack_certs: RackCerts, who: str
) -> None:
    _, b = members
    outsider = LinkEndpoint(
        "rdu-n1-s0", tls={"plaintext": None, "foreign": rack_certs.foreign,
                          "stranger": rack_certs.stranger}[who],
    )  # fmt: skip
    try:
        outsider.connect({B: b.address})
        with pytest.raises(LinkFailure) as e:
            outsider.send(B, "t", 0, 0, 10, 8, b"12345678", timeout_s=3)
        if who == "stranger":  # the handshake passes (same CA); membership does not
            assert "PERMISSION_DENIED" in str(e.value) and "rdurack-rack" in str(e.value)
        else:
            assert "UNAVAILABLE" in str(e.value)
        with pytest.raises(LinkFailure):
            outsider.ping(B, timeout_s=3)
    finally:
        outsider.close()
    with pytest.raises(LinkFailure):
        b.receive("t", 0, "rdu-n1-s0", timeout_s=0.2)  # nothing was delivered


def test_a_raw_client_without_a_certificate_cannot_ping(
    members: tuple[LinkEndpoint, LinkEndpoint], rack_certs: RackCerts
) -> None:
    _, b = members
    credentials = grpc.ssl_channel_credentials(rack_certs.member.ca_pem())
    options = [("grpc.ssl_target_name_override", "rdurack-rack")]
    with grpc.secure_channel(b.address, credentials, options) as ch:
        stub = link_pb2_grpc.LinkServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Ping(link_pb2.PingRequest(src_socket_id=A), timeout=3)
    assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNAVAILABLE
