"""An endpoint's forward passes (workloads/serving/stream/pricing.py `Pass`) <-> the
proto's ServePass, both directions; what a client sends is checked by name."""

from __future__ import annotations

from collections.abc import Sequence

from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import Shape
from rdurack.v1 import serve_pb2
from rdurack.wire import rack as convert
from rdurack.workloads.serving.stream.pricing import Pass

# More shapes than this in one pass is not an engine's iteration (a shape per distinct
# (new tokens, context) pair: at most one per request of a batch).
MAX_SHAPES = 4096


def pass_to_proto(done: Pass) -> serve_pb2.ServePass:
    return serve_pb2.ServePass(
        plan=convert.PLAN_TO_PROTO[done.plan],
        shapes=[
            serve_pb2.PassShape(
                batch=s.batch, new_tokens=s.new_tokens, context=s.context, causal=s.causal
            )
            for s in done.shapes
        ],
        logits=done.logits,
        invokes=done.invokes,
    )


def passes_from_proto(msgs: Sequence[serve_pb2.ServePass], field: str = "passes") -> list[Pass]:
    """The passes, or InvalidRequest naming the first bad field (`passes[2].shapes[0]`)."""
    return [_pass(m, f"{field}[{i}]") for i, m in enumerate(msgs)]


def _pass(m: serve_pb2.ServePass, field: str) -> Pass:
    if m.plan not in convert.PLANS:
        raise InvalidRequest(f"{field}.plan: {m.plan} is not a fusion plan")
    if not m.shapes or len(m.shapes) > MAX_SHAPES:
        raise InvalidRequest(f"{field}.shapes: 1 to {MAX_SHAPES} shapes, got {len(m.shapes)}")
    shapes = []
    for j, s in enumerate(m.shapes):
        if s.batch == 0 or s.new_tokens == 0 or s.context < s.new_tokens:
            raise InvalidRequest(
                f"{field}.shapes[{j}]: batch and new_tokens must be positive and context at "
                f"least new_tokens (got {s.batch}, {s.new_tokens}, {s.context})"
            )
        shapes.append(Shape(s.batch, s.new_tokens, s.context, s.causal))
    tokens = sum(s.tokens for s in shapes)
    if m.logits > tokens:
        raise InvalidRequest(f"{field}.logits: {m.logits} exceeds the pass's {tokens} tokens")
    return Pass(convert.PLANS[m.plan], tuple(shapes), m.logits, m.invokes)
