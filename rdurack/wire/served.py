"""The requests an endpoint's passes served (telemetry/served.py `PassesServed`) <-> the
proto's PassesServed, both directions; what a client sends is checked by name."""

from __future__ import annotations

from rdurack.errors import InvalidRequest
from rdurack.telemetry.served import PassesServed, ServedRequest
from rdurack.v1 import served_pb2

TRACE_ID_BYTES, SPAN_ID_BYTES = 16, 8


def served_to_proto(served: PassesServed) -> served_pb2.PassesServed:
    return served_pb2.PassesServed(
        first_iteration=served.first_iteration,
        requests=[
            served_pb2.ServedRequest(
                request=r.request,
                trace_id=r.trace_id.to_bytes(TRACE_ID_BYTES, "big"),
                span_id=r.span_id.to_bytes(SPAN_ID_BYTES, "big"),
            )
            for r in served.requests
        ],
        passes=[served_pb2.PassServed(requests=p) for p in served.passes],
    )


def served_from_proto(
    m: served_pb2.PassesServed, passes: int, field: str = "served"
) -> PassesServed | None:
    """What a call of `passes` passes served; None when the caller sent nothing (its
    passes' spans link to nothing); InvalidRequest naming the first bad field."""
    if not m.passes and not m.requests:
        return None
    if len(m.passes) != passes:
        raise InvalidRequest(f"{field}.passes: one per pass ({passes}), got {len(m.passes)}")
    requests = []
    for i, r in enumerate(m.requests):
        trace_id = int.from_bytes(r.trace_id, "big")
        span_id = int.from_bytes(r.span_id, "big")
        if len(r.trace_id) != TRACE_ID_BYTES or len(r.span_id) != SPAN_ID_BYTES:
            raise InvalidRequest(
                f"{field}.requests[{i}]: a trace id of {TRACE_ID_BYTES} bytes and a span id "
                f"of {SPAN_ID_BYTES}, got {len(r.trace_id)} and {len(r.span_id)}"
            )
        if trace_id == 0 or span_id == 0:
            raise InvalidRequest(f"{field}.requests[{i}]: all-zero ids are invalid (W3C)")
        requests.append(ServedRequest(r.request, trace_id, span_id))
    for i, p in enumerate(m.passes):
        if any(j >= len(requests) for j in p.requests):
            raise InvalidRequest(
                f"{field}.passes[{i}].requests: indices of {field}.requests, which has "
                f"{len(requests)}"
            )
    return PassesServed(
        m.first_iteration, tuple(requests), tuple(tuple(p.requests) for p in m.passes)
    )
