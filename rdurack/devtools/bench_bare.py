"""The bare processes of the data plane's floors (bench_rack_floors.py): Ray actors with
nothing of a socket in them.

- `Bare`: an actor that only answers; 16 of them started together are the floor of
  the rack's bring-up.
- `Member`: an actor with a bare gRPC server (no protobuf, no tracing, no checks: the
  methods take and return raw bytes) and a channel to one peer. Two of them are the
  floor of the link throughput (`send`: the same bytes as the link's transfer, in the
  link's chunks, on one client stream); 16 in a ring are the floor of the functional
  all-reduce (`all_reduce`: the same ring, the same bytes per step, one client stream
  to the next member for the whole collective, the reduction a numpy add).

Both are num_cpus=0, as the socket actors are, so Ray places all 16 on a 2-core node.
A member tunes its allocator as a socket's process does (node_agent/heap.py): without
it every 1 MiB message takes its pages' faults anew, which measures glibc's defaults,
not gRPC's streaming, and the floor would be slower than the link built on it.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import ray

from rdurack.node_agent import heap
from rdurack.node_agent.links.sending import CHUNK_BYTES

SERVICE = "floor.Member"
TRANSFER = "Transfer"  # a client stream of chunks; answers b"" at its end
RING = "Ring"  # a client stream of ring segments, each put in the inbox
# Messages as large as a ring segment of a big tensor (gRPC's default is 4 MB).
OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]
_remote: Any = ray.remote
_END = b""  # closes the request stream of a ring


class Bare:
    """Nothing but an answer: the least a process the rack starts must do."""

    def ready(self) -> bool:
        return True


class Member:
    """A bare process with a gRPC server and a channel to its peer (module docstring)."""

    def __init__(self, payload_bytes: int) -> None:
        heap.keep_freed_buffers()
        self._received = np.empty(payload_bytes, dtype=np.uint8)  # the receiver's buffer
        self._payload = np.ones(payload_bytes // 4, dtype=np.float32)  # what it sends
        self._inbox: queue.Queue[bytes] = queue.Queue()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=OPTIONS)
        self._server.add_generic_rpc_handlers((_handlers(self),))
        self._port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self._peer: grpc.Channel | None = None

    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    def connect(self, peer: str) -> None:
        """Open the channel to `peer` (the link's other end, or the ring's next member)."""
        self._peer = grpc.insecure_channel(peer, options=OPTIONS)
        grpc.channel_ready_future(self._peer).result(timeout=30)

    def send(self, nbytes: int) -> int:
        """Stream `nbytes` of the payload to the peer in the link's chunks; returns once
        the peer has every byte (its answer to the stream)."""
        assert self._peer is not None
        data = self._payload.view(np.uint8)[:nbytes]
        chunks = (data[o : o + CHUNK_BYTES].tobytes() for o in range(0, nbytes, CHUNK_BYTES))
        transfer: grpc.StreamUnaryMultiCallable[bytes, bytes]
        transfer = self._peer.stream_unary(f"/{SERVICE}/{TRANSFER}")
        transfer(chunks, timeout=120)
        return nbytes

    def received(self, chunks: Iterator[bytes]) -> bytes:
        offset = 0
        for chunk in chunks:  # copied into the receiver's buffer, as the link does
            self._received[offset : offset + len(chunk)] = np.frombuffer(chunk, np.uint8)
            offset += len(chunk)
        return b""

    def all_reduce(self, rank: int, size: int, elements: int) -> float:
        """A ring all-reduce of `elements` float32 (ones) over `size` members, this one
        `rank`: size - 1 reduce-scatter steps (receive a segment, add it), then size - 1
        all-gather steps (receive a segment, keep it). Returns element 0 (size)."""
        assert self._peer is not None
        data = np.ones(elements, dtype=np.float32)
        segments = np.array_split(data, size)  # views into `data`
        outbox: queue.Queue[bytes] = queue.Queue()
        ring: grpc.StreamUnaryMultiCallable[bytes, bytes]
        ring = self._peer.stream_unary(f"/{SERVICE}/{RING}")
        stream = ring.future(iter(outbox.get, _END), timeout=120)
        for step in range(size - 1):
            outbox.put(segments[(rank - step) % size].tobytes())
            got = np.frombuffer(self._inbox.get(timeout=60), np.float32)
            segments[(rank - step - 1) % size] += got
        for step in range(size - 1):
            outbox.put(segments[(rank + 1 - step) % size].tobytes())
            got = np.frombuffer(self._inbox.get(timeout=60), np.float32)
            segments[(rank - step) % size][:] = got
        outbox.put(_END)
        stream.result()
        return float(data[0])

    def ring_in(self, messages: Iterator[bytes]) -> bytes:
        for m in messages:
            self._inbox.put(m)
        return b""


def _handlers(member: Member) -> grpc.GenericRpcHandler:
    """The member's two methods, on raw bytes (no serializers)."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            TRANSFER: grpc.stream_unary_rpc_method_handler(lambda it, _: member.received(it)),
            RING: grpc.stream_unary_rpc_method_handler(lambda it, _: member.ring_in(it)),
        },
    )


BareActor: Any = _remote(num_cpus=0)(Bare)
MemberActor: Any = _remote(num_cpus=0)(Member)
