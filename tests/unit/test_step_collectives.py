"""A kernel step's collectives drawn on the trace: one of each, as the links would run
them (node_agent/timeline/step_collectives.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.errors import InvalidRequest
from rdurack.node_agent.runs import Run
from rdurack.node_agent.socket import Socket
from rdurack.node_agent.timeline.step_collectives import draw, step_collectives
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.rack.topology import SocketId, Topology
from rdurack.telemetry import names
from rdurack.workloads.predictor import Predictor
from tests.support.sockets import together

RACK = platform("sn40l-rack16")
JOB = "job-draw"
# Two sockets in each node: the all-reduces cross the nodes on rails.
GROUP = ["rdu-n0-s0", "rdu-n0-s1", "rdu-n1-s0", "rdu-n1-s1"]


def _a(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _start(span: ReadableSpan) -> int:
    return int(_a(span)[names.ATTR_EMULATED_START_NS])


def _children(done: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    found = [s for s in done if s.parent and s.parent.span_id == parent.context.span_id]
    return sorted(found, key=_start)


def _sends(done: Sequence[ReadableSpan], collective: ReadableSpan) -> list[tuple[Any, ...]]:
    """Each send: (link, kind, bytes, sent and arrived ns after the collective began)."""
    t0 = _start(collective)
    return [
        (
            _a(t)[names.ATTR_LINK],
            _a(t)[names.ATTR_LINK_KIND],
            _a(t)[names.ATTR_BYTES],
            _start(t) - t0,
            _start(t) + _a(t)[names.ATTR_EMULATED_NS] - t0,
        )
        for t in _children(done, collective)
    ]


def test_a_step_lists_each_all_reduce_once_with_how_often_it_runs() -> None:
    ds = model("deepseek-r1")
    step = Predictor(RACK).decompose(ds, Phase.DECODE, 1, 1024, 16)
    found = {(c.tag, c.per_step) for c in step_collectives(step)}
    assert found == {
        ("decoder_layer.attn_all_reduce", ds.dense_layers),
        ("decoder_layer.mlp_all_reduce", ds.dense_layers),
        ("moe_layer.attn_all_reduce", ds.moe_layers),
        ("moe_layer.experts_combine", ds.moe_layers),
    }
    # One socket alone has nothing to all-reduce.
    assert step_collectives(Predictor(RACK).decompose(ds, Phase.DECODE, 1, 1024, 1)) == []


def test_the_first_kernel_of_a_job_draws_its_collectives_as_the_links_run_them(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Each drawn all-reduce sends what the same all-reduce executed over the sockets'
    gRPC links sends, on the same links, at the same emulated offsets."""
    provider, exporter = spans
    sockets = {sid: Socket(sid, RACK, timeout_s=10.0, tracer_provider=provider) for sid in GROUP}
    peers = {sid: s.address() for sid, s in sockets.items()}
    mixtral = model("mixtral-8x7b")
    try:
        for s in sockets.values():
            s.connect(peers)
            s.reserve(JOB)

        def kernel(s: Socket) -> Run:
            return s.run_kernel(
                JOB, mixtral, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 4, 512, 4, 8, group=GROUP
            )

        together(sockets, kernel)
        together(sockets, kernel)  # the job's second call draws nothing more
        drawn = exporter.get_finished_spans()
        kernels = [k for k in drawn if k.name == names.SPAN_KERNEL]
        assert len(kernels) == 2 * len(GROUP)
        executed: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
        first = {sid: min((k for k in kernels if _a(k)[names.ATTR_SOCKET] == sid), key=_start)
                 for sid in GROUP}  # fmt: skip
        collectives = {sid: _children(drawn, k) for sid, k in first.items()}
        for sid in GROUP:
            later = max((k for k in kernels if _a(k)[names.ATTR_SOCKET] == sid), key=_start)
            assert _children(drawn, later) == []
        tags = [_a(c)[names.ATTR_COLLECTIVE_TAG] for c in collectives[GROUP[0]]]
        assert tags == [
            "moe_layer.attn_all_reduce",
            "moe_layer.experts_combine",
        ]
        # Run each for real, every member from one start, and record its sends.
        for i, tag in enumerate(tags):
            a = _a(collectives[GROUP[0]][i])
            t0 = max(s.clock.now_ns for s in sockets.values())
            exporter.clear()

            def real(s: Socket, a: dict[str, Any] = a, t0: int = t0, i: int = i) -> Run:
                return s.collective(
                    JOB,
                    "all_reduce",
                    f"real-{i}",
                    GROUP,
                    nbytes=a[names.ATTR_BYTES],
                    dtype="float16",  # BF16's size: the drawing's elements
                    algorithm=a[names.ATTR_COLLECTIVE_ALGORITHM],
                    start_ns=t0,
                )

            together(sockets, real)
            done = exporter.get_finished_spans()
            for c in (c for c in done if c.name == names.SPAN_COLLECTIVE):
                executed.setdefault(_a(c)[names.ATTR_SOCKET], {})[tag] = _sends(done, c)
    finally:
        for s in sockets.values():
            s.close()
    kinds = set()
    for sid in GROUP:
        roles = []
        for c in collectives[sid]:
            a = _a(c)
            assert a[names.ATTR_COLLECTIVE_DRAWN] is True
            assert a[names.ATTR_COLLECTIVE_PER_STEP] == mixtral.moe_layers
            roles.append(a[names.ATTR_MOE_ROLE])
            sends = _sends(drawn, c)
            assert sends and sends == executed[sid][a[names.ATTR_COLLECTIVE_TAG]]
            assert a[names.ATTR_TRANSFERS] == len(sends)
            kinds |= {kind for _, kind, *_ in sends}
        assert roles == ["dispatch", "combine"]
        # Laid one after the other inside the kernel's span.
        (k,) = [k for k in first.values() if _a(k)[names.ATTR_SOCKET] == sid]
        ends = [_start(c) + _a(c)[names.ATTR_EMULATED_NS] for c in collectives[sid]]
        assert _start(k) == _start(collectives[sid][0])
        assert ends[0] <= _start(collectives[sid][1])
        assert ends[-1] <= _start(k) + _a(k)[names.ATTR_EMULATED_NS]
    assert kinds == {"intra-node", "inter-node"}  # the dispatch crosses the nodes


def test_a_socket_outside_the_group_is_refused() -> None:
    topo = Topology(RACK)
    step = Predictor(RACK).decompose(model("llama2-7b"), Phase.DECODE, 1, 128, 2)
    (first, *_) = step_collectives(step)
    group = [SocketId.parse(g) for g in GROUP[:2]]
    with pytest.raises(InvalidRequest, match="not in the group"):
        draw(topo, group, SocketId.parse("rdu-n1-s7"), first, 0)


def test_deepseek_dispatch_on_the_rack_is_a_direct_all_reduce_over_node_and_rail() -> None:
    """What docs/moe.md says of DeepSeek-R1's dispatch on 16 sockets."""
    topo = Topology(RACK)
    ds = model("deepseek-r1")
    step = Predictor(RACK).decompose(ds, Phase.DECODE, 1, 1024, 16)
    [dispatch] = [c for c in step_collectives(step) if c.tag == "moe_layer.attn_all_reduce"]
    me = SocketId.parse("rdu-n1-s3")
    d = draw(topo, topo.sockets, me, dispatch, 0)
    assert d.attributes[names.ATTR_COLLECTIVE_ALGORITHM] == "direct"
    assert d.attributes[names.ATTR_BYTES] == ds.hidden * 2 == 14336
    kinds = sorted(s.kind for s in d.traffic.sends)
    assert kinds == ["inter-node"] + 7 * ["intra-node"]
    assert d.traffic.sends[-1].link == "rdu-n1-s3->rdu-n0-s3"  # its rail peer
    assert dispatch.per_step == ds.moe_layers == 58
    assert 5_000 < d.end_ns < 30_000  # ns: "about 13 us" at the calibrated latencies
