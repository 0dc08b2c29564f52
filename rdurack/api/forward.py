"""An endpoint's passes sent to an orchestrator replica that does not lead, forwarded to
the one that does.

Only the leader runs jobs (orchestrator/leadership.py), so only it holds an endpoint
job's sockets; but a client reaches whichever replica a Service sends it to. A follower
that is asked to run passes forwards the call, once, to the leader's address (the name
it holds the lease by: its address by default), with the caller's bearer token, and
answers with the leader's answer. A forwarded call is never forwarded again: a replica
that lost the lease meanwhile answers FAILED_PRECONDITION, naming the leader it knows,
and the client calls again.
"""

from __future__ import annotations

import threading

import grpc

from rdurack.api.server import channel
from rdurack.errors import NotLeader
from rdurack.security.tls import TlsConfig
from rdurack.v1 import job_pb2, job_pb2_grpc

FORWARDED = "x-rdurack-forwarded"  # metadata of a call one replica forwarded to another
PASSED_ON = ("authorization",)  # the caller's metadata the leader needs: who calls


class Forwarder:
    """Channels to the leaders this replica has forwarded to, one per address; `tls`:
    this replica's own files, which make its channels in-rack (mutual TLS)."""

    def __init__(self, tls: TlsConfig | None) -> None:
        self._tls = tls
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def run_passes(
        self, refused: NotLeader, request: job_pb2.RunPassesRequest, context: grpc.ServicerContext
    ) -> job_pb2.RunPassesResponse:
        """The leader's answer to `request`, which this replica `refused`; re-raises
        `refused` when there is no leader or the call was forwarded already."""
        metadata = context.invocation_metadata() or ()
        if not refused.leader or any(k == FORWARDED for k, _ in metadata):
            raise refused
        passed = tuple((k, v) for k, v in metadata if k in PASSED_ON)
        stub = job_pb2_grpc.JobServiceStub(self._channel(refused.leader))
        try:
            reply: job_pb2.RunPassesResponse = stub.RunPasses(
                request, timeout=context.time_remaining(), metadata=(*passed, (FORWARDED, "1"))
            )
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNAVAILABLE
            details = e.details() if isinstance(e, grpc.Call) else str(e)
            context.abort(code, f"the leader {refused.leader}: {details}")
        return reply

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = channel(address, tls=self._tls, rack=True)
            return self._channels[address]

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
