"""The data plane's socket-to-socket links over gRPC rdurack.v1.LinkService.

Each emulated socket owns one LinkEndpoint (endpoint.py): a LinkService server
(servicer.py) that puts what arrives in the socket's Mailbox (mailbox.py), and reused
channels to its peers on which it puts its own transfers (sending.py), in messages that
wire.py writes and reads.

A transfer is one gRPC call: a unary `Deliver` (header and payload in one message) for a
timing-only transfer or a payload of at most DELIVER_MAX_BYTES, else a client-streaming
`Transfer` (a TransferHeader, then the payload in CHUNK_BYTES slices); link.proto says
why both exist. The receiving server checks both alike and puts the transfer in the
socket's Mailbox, where the socket's own thread takes it by (collective tag, step,
sender).

Emulated time never depends on the wire: the sender prices the transfer with its own
link model and stamps the arrival (ns) in the header; the receiver's clock moves to it
when the socket consumes the message. Wall time only bounds how long a call may take
(`timeout_s`).

Security: with a TlsConfig the server is mutual TLS and admits only rack members (a
client certificate of the rack CA naming the rack identity; security/tls.py), and the
channels to peers present this socket's member certificate and expect a member. Every
request passes the same guard as every rdurack server (security/guard.py): undecodable
messages and fields out of bounds are INVALID_ARGUMENT before the servicer runs.

Every failure a caller sees is a LinkFailure (link or peer trouble) or an InvalidRequest
(bad arguments), never a raw grpc.RpcError.
"""
