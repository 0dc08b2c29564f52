"""An endpoint's forward passes (workloads/serving/stream/pricing.py `Pass`) <-> the
proto's ServePass, both directions; what a client sends is checked by name."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import Shape
from rdurack.v1 import job_pb2, node_agent_pb2, serve_pb2
from rdurack.wire import rack as convert
from rdurack.workloads.serving.stream.bundle import BundleLayout
from rdurack.workloads.serving.stream.pricing import Pass

# More shapes than this in one pass is not an engine's iteration (a shape per distinct
# (new tokens, context) pair: at most one per request of a batch).
MAX_SHAPES = 4096
MAX_EXPERT_CHARS = 200  # an expert's name (the catalog's are under 40)


def _shapes_to_proto(shapes: Sequence[Shape]) -> list[serve_pb2.PassShape]:
    return [
        serve_pb2.PassShape(
            batch=s.batch, new_tokens=s.new_tokens, context=s.context, causal=s.causal
        )
        for s in shapes
    ]


def pass_to_proto(done: Pass) -> serve_pb2.ServePass:
    return serve_pb2.ServePass(
        plan=convert.PLAN_TO_PROTO[done.plan],
        shapes=_shapes_to_proto(done.shapes),
        logits=done.logits,
        invokes=done.invokes,
        expert=done.expert,
        switch_in=done.switch,
        routed=_shapes_to_proto(done.routed),
    )


def bundle_to_proto(layout: BundleLayout | None) -> serve_pb2.ServeBundle | None:
    if layout is None:
        return None
    return serve_pb2.ServeBundle(
        experts=layout.experts,
        router_model=layout.router_model,
        region_experts=layout.region_experts,
    )


def bundle_from_proto(
    owner: job_pb2.EndpointJob | node_agent_pb2.NodePassesRequest, field: str = "bundle"
) -> BundleLayout | None:
    """`owner`'s ServeBundle field as a layout (None if unset); InvalidRequest naming
    the bad field."""
    if not owner.HasField("bundle"):
        return None
    m = owner.bundle
    try:
        return BundleLayout(
            experts=m.experts, router_model=m.router_model, region_experts=m.region_experts
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join([field, *(str(x) for x in first["loc"])])  # no loc: the whole
        raise InvalidRequest(f"{where}: {first['msg']}") from None


def passes_from_proto(msgs: Sequence[serve_pb2.ServePass], field: str = "passes") -> list[Pass]:
    """The passes, or InvalidRequest naming the first bad field (`passes[2].shapes[0]`)."""
    return [_pass(m, f"{field}[{i}]") for i, m in enumerate(msgs)]


def _pass(m: serve_pb2.ServePass, field: str) -> Pass:
    if m.plan not in convert.PLANS:
        raise InvalidRequest(f"{field}.plan: {m.plan} is not a fusion plan")
    if not m.shapes or len(m.shapes) > MAX_SHAPES:
        raise InvalidRequest(f"{field}.shapes: 1 to {MAX_SHAPES} shapes, got {len(m.shapes)}")
    if len(m.routed) > MAX_SHAPES:
        raise InvalidRequest(f"{field}.routed: at most {MAX_SHAPES} shapes, got {len(m.routed)}")
    if len(m.expert) > MAX_EXPERT_CHARS:
        raise InvalidRequest(f"{field}.expert: at most {MAX_EXPERT_CHARS} characters")
    shapes = _shapes(m.shapes, f"{field}.shapes")
    tokens = sum(s.tokens for s in shapes)
    if m.logits > tokens:
        raise InvalidRequest(f"{field}.logits: {m.logits} exceeds the pass's {tokens} tokens")
    routed = _shapes(m.routed, f"{field}.routed")
    return Pass(convert.PLANS[m.plan], shapes, m.logits, m.invokes, m.expert, m.switch_in, routed)


def _shapes(msgs: Sequence[serve_pb2.PassShape], field: str) -> tuple[Shape, ...]:
    out = []
    for j, s in enumerate(msgs):
        if s.batch == 0 or s.new_tokens == 0 or s.context < s.new_tokens:
            raise InvalidRequest(
                f"{field}[{j}]: batch and new_tokens must be positive and context at "
                f"least new_tokens (got {s.batch}, {s.new_tokens}, {s.context})"
            )
        out.append(Shape(s.batch, s.new_tokens, s.context, s.causal))
    return tuple(out)
