"""What a socket's hardware spans say (node_agent/timeline/hardware_trace.py, training/):
FLOPs and tier on kernels, links and a span per send on collectives, and a DDP rank's
steps, gradient all-reduces and checkpoints, nested on the emulated timeline and
bounded. Sockets without Ray, real gRPC links, an in-memory exporter per test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.node_agent.socket import Socket
from rdurack.node_agent.timeline.hardware_trace import (
    MAX_TRANSFER_SPANS,
    HardwareTrace,
    Sent,
    Traffic,
)
from rdurack.node_agent.training.spans import MAX_TRACED_STEPS, traced
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.telemetry import names
from rdurack.telemetry.propagation import inject
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.training.checkpoint import load, state_bytes
from rdurack.workloads.training.job import RankReport, TrainingWorkload
from tests.support.sockets import together

RACK = platform("sn40l-rack16")
JOB = "job-h"
# Two ranks on a rail (one per node) and a third that makes the ring route a hop.
PAIR = ["rdu-n0-s0", "rdu-n1-s0"]
TRIO = ["rdu-n0-s0", "rdu-n0-s1", "rdu-n1-s0"]


def _sockets(ids: Sequence[str], provider: TracerProvider) -> list[Socket]:
    made = [Socket(sid, RACK, timeout_s=10.0, tracer_provider=provider) for sid in ids]
    peers = {s.name: s.address() for s in made}
    for s in made:
        s.connect(peers)
    return made


@pytest.fixture
def pair(spans: tuple[TracerProvider, InMemorySpanExporter]) -> Iterator[list[Socket]]:
    made = _sockets(PAIR, spans[0])
    yield made
    for s in made:
        s.close()


def _a(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _start(span: ReadableSpan) -> int:
    return int(_a(span)[names.ATTR_EMULATED_START_NS])


def _end(span: ReadableSpan) -> int:
    return _start(span) + int(_a(span)[names.ATTR_EMULATED_NS])


def _named(
    done: Sequence[ReadableSpan], name: str, socket: str | None = None
) -> list[ReadableSpan]:
    found = [s for s in done if s.name == name and socket in (None, _a(s)[names.ATTR_SOCKET])]
    return sorted(found, key=_start)


def _parent(span: ReadableSpan, done: Sequence[ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None
    parent_id = span.parent.span_id
    [parent] = [s for s in done if s.context is not None and s.context.span_id == parent_id]
    return parent


def _inside(child: ReadableSpan, parent: ReadableSpan) -> bool:
    return _start(parent) <= _start(child) <= _end(child) <= _end(parent)


def _sequential(mine: Sequence[ReadableSpan]) -> bool:
    """One after the other on the socket's clock (touching is fine)."""
    ordered = sorted(mine, key=_start)
    return all(_end(a) <= _start(b) for a, b in pairwise(ordered))


# ------------------------------------------------------------------ kernels


def test_a_kernel_span_carries_the_flops_the_socket_executed_and_its_tier(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    s = Socket("rdu-n0-s3", RACK, tracer_provider=provider)
    m = model("llama2-7b")
    try:
        s.reserve(JOB)
        run = s.run_kernel(JOB, m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 2, 1024, 8, steps=20)
    finally:
        s.close()
    [span] = _named(exporter.get_finished_spans(), names.SPAN_KERNEL)
    a = _a(span)
    step = Predictor(RACK).step(m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 2, 1024, 8)
    assert a[names.ATTR_FLOPS] == run.flops == int(20 * step.flops)
    # Per socket and per token: about 2 FLOPs per weight of its 1/8 share (attention over
    # the 1024-token context adds a little), so not the group's total nor one step's.
    per_token = a[names.ATTR_FLOPS] / (20 * 2)
    layers = m.layers * m.layer_params / 8
    assert 2 * layers <= per_token <= 1.25 * 2 * m.params / 8
    assert a[names.ATTR_TIER] == "hbm"
    shape = (a[names.ATTR_BATCH], a[names.ATTR_SEQUENCE_LENGTH], a[names.ATTR_STEPS])
    assert shape == (2, 1024, 20)


# ------------------------------------------------------------------ collectives


def test_a_collective_names_its_links_and_traces_each_send_until_it_arrives(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    trio = _sockets(TRIO, provider)
    try:
        for s in trio:
            s.reserve(JOB)
        with provider.get_tracer("t").start_as_current_span("agent"):
            carrier = inject()
        runs = together(
            {s.name: s for s in trio},
            lambda s: s.collective(
                JOB, "all_reduce", "ar", TRIO, nbytes=3 * 65536, algorithm="ring", carrier=carrier
            ),
        )
    finally:
        for s in trio:
            s.close()
    done = exporter.get_finished_spans()
    # The ring n0-s0 -> n0-s1 -> n1-s0 -> n0-s0: one link each, 2 (3 - 1) sends of 1/3.
    ring = {
        "rdu-n0-s0": ("rdu-n0-s1", "intra-node"),
        "rdu-n0-s1": ("rdu-n1-s0", "inter-node"),
        "rdu-n1-s0": ("rdu-n0-s0", "inter-node"),
    }
    collectives = {_a(c)[names.ATTR_SOCKET]: c for c in _named(done, names.SPAN_COLLECTIVE)}
    assert set(collectives) == set(TRIO)
    for sid, c in collectives.items():
        a, (peer, kind) = _a(c), ring[sid]
        assert list(a[names.ATTR_LINKS]) == [f"{sid}->{peer}"]
        assert list(a[names.ATTR_LINK_KINDS]) == [kind]
        assert (a[names.ATTR_TRANSFERS], a[names.ATTR_TRANSFERS_UNTRACED]) == (4, 0)
        assert a[names.ATTR_BYTES_SENT] == runs[sid].bytes_sent == 4 * 65536
        sends = [t for t in _named(done, names.SPAN_TRANSFER, sid) if _parent(t, done) is c]
        assert len(sends) == 4 == len(_named(done, names.SPAN_TRANSFER, sid))
        for t in sends:
            ta = _a(t)
            assert (ta[names.ATTR_LINK], ta[names.ATTR_LINK_KIND]) == (f"{sid}->{peer}", kind)
            assert ta[names.ATTR_BYTES] == 65536 and ta[names.ATTR_COLLECTIVE_TAG] == "ar"
            # Sent during the sender's part; it arrives while the receiver waits for it
            # (the sender does not: its span may end first).
            assert _start(c) <= _start(t) <= _end(c)
            assert _end(t) <= _end(collectives[peer])
            assert t.end_time is not None and t.start_time is not None
            assert t.end_time - t.start_time == ta[names.ATTR_EMULATED_NS] > 0


def test_a_collective_traces_at_most_its_bound_of_sends(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    hw = HardwareTrace("rdu-n0-s0", provider)
    sends = [Sent("rdu-n0-s0->rdu-n0-s1", "intra-node", i, i + 10, 8) for i in range(100)]
    traffic = Traffic(bytes_sent=800, sends=sends)
    hw.collective(trace.set_span_in_context(trace.INVALID_SPAN), JOB, 0, 200, {}, traffic)
    done = exporter.get_finished_spans()
    [c] = _named(done, names.SPAN_COLLECTIVE)
    assert (_a(c)[names.ATTR_TRANSFERS], _a(c)[names.ATTR_TRANSFERS_UNTRACED]) == (100, 36)
    assert len(_named(done, names.SPAN_TRANSFER)) == MAX_TRANSFER_SPANS == 64
    assert list(_a(c)[names.ATTR_LINKS]) == ["rdu-n0-s0->rdu-n0-s1"]  # once, though 100 sends


# ------------------------------------------------------------------ training

SMALL = TrainingWorkload(
    world_size=2,
    global_batch=32,
    steps=6,
    checkpoint_every=3,
    dataset="synthetic",  # no scikit-learn import for six steps
)


def _train(
    sockets: list[Socket], w: TrainingWorkload, job: str, ckpt: Path, segments: Sequence[int]
) -> list[list[RankReport]]:
    """The orchestrator's way: every rank, segment by segment (0: to the end)."""
    group = [s.name for s in sockets]
    out = []
    with ThreadPoolExecutor(len(sockets)) as pool:
        for s in sockets:
            s.reserve(job)
        for steps in segments:
            futures = [
                pool.submit(s.train, job, w, group, steps=steps, checkpoint_dir=str(ckpt))
                for s in sockets
            ]
            out.append([f.result(timeout=60) for f in futures])
        for s in sockets:
            s.release(job)
    return out


def test_a_rank_traces_its_steps_with_their_losses_all_reduces_and_checkpoints(
    spans: tuple[TracerProvider, InMemorySpanExporter], pair: list[Socket], tmp_path: Path
) -> None:
    _, exporter = spans
    segments = _train(pair, SMALL, JOB, tmp_path, [1, 3, 0])
    done = exporter.get_finished_spans()
    for rank, sid in enumerate(PAIR):
        reports = [seg[rank] for seg in segments]
        losses = [x for r in reports for x in r.losses]
        steps = _named(done, names.SPAN_TRAIN_STEP, sid)
        assert [_a(s)[names.ATTR_STEP] for s in steps] == [1, 2, 3, 4, 5, 6]
        assert [_a(s)[names.ATTR_LOSS] for s in steps] == losses  # the rank's own
        assert all(_a(s)[names.ATTR_RANK] == rank for s in steps)
        assert all(_a(s)[names.ATTR_PEAK_BYTES.format(tier="hbm")] > 0 for s in steps)
        segs = _named(done, names.SPAN_TRAIN, sid)
        assert [_a(s)[names.ATTR_STEPS_UNTRACED] for s in segs] == [0, 0, 0]
        assert _sequential(segs) and _sequential(steps)
        for step in steps:
            segment = _parent(step, done)
            assert segment.name == names.SPAN_TRAIN and _inside(step, segment)
            [reduce] = [
                r for r in _named(done, names.SPAN_TRAIN_ALLREDUCE, sid) if _parent(r, done) is step
            ]
            a = _a(reduce)
            assert _inside(reduce, step)
            # It overlaps backward: it starts after the step's forward, and what the
            # compute stream waited for is at most all of it.
            assert _start(reduce) > _start(step)
            assert 0 <= a[names.ATTR_EXPOSED_NS] <= a[names.ATTR_EMULATED_NS]
            assert a[names.ATTR_BYTES] == sum(reports[-1].result["bucket_bytes"])
            assert a[names.ATTR_BUCKETS] == len(reports[-1].result["bucket_bytes"])
            assert list(a[names.ATTR_LINKS]) == [f"{sid}->{PAIR[1 - rank]}"]
            assert list(a[names.ATTR_LINK_KINDS]) == ["inter-node"]
        checkpoints = _named(done, names.SPAN_CHECKPOINT, sid)
        if rank != 0:
            assert checkpoints == []  # only rank 0 writes
            continue
        assert [_a(c)[names.ATTR_STEP] for c in checkpoints] == [3, 6]
        for c in checkpoints:
            a = _a(c)
            assert a[names.ATTR_CHECKPOINT_ACTION] == "save" and a[names.ATTR_TIER] == "hbm"
            assert a[names.ATTR_BYTES] == state_bytes(
                load(a[names.ATTR_CHECKPOINT_PATH], device=sid)
            )
            assert _parent(c, done).name == names.SPAN_TRAIN and _inside(c, _parent(c, done))
            # After the step it holds, before the next one.
            held = next(s for s in steps if _a(s)[names.ATTR_STEP] == a[names.ATTR_STEP])
            assert _end(held) <= _start(c)
            assert all(_end(c) <= _start(s) for s in steps if _start(s) > _start(held))


def test_ranks_that_resume_trace_the_checkpoint_they_load(
    spans: tuple[TracerProvider, InMemorySpanExporter], pair: list[Socket], tmp_path: Path
) -> None:
    _, exporter = spans
    w = SMALL.model_copy(update={"steps": 3})
    _train(pair, w, JOB, tmp_path, [0])  # writes ckpt at step 3
    exporter.clear()
    six = SMALL  # the same directory, 3 more steps: a job resumed after a retry
    _train(pair, six, "job-again", tmp_path, [0])
    done = exporter.get_finished_spans()
    for rank, sid in enumerate(PAIR):
        loads = [
            c
            for c in _named(done, names.SPAN_CHECKPOINT, sid)
            if _a(c)[names.ATTR_CHECKPOINT_ACTION] == "load"
        ]
        assert len(loads) == 1
        a = _a(loads[0])
        assert a[names.ATTR_STEP] == 3 and a[names.ATTR_RANK] == rank
        assert Path(a[names.ATTR_CHECKPOINT_PATH]).name == "ckpt-00000003.pt"
        steps = _named(done, names.SPAN_TRAIN_STEP, sid)
        assert [_a(s)[names.ATTR_STEP] for s in steps] == [4, 5, 6]
        assert _end(loads[0]) <= _start(steps[0])  # loaded before the first step


def test_the_traced_steps_are_evenly_spaced_and_at_most_the_bound() -> None:
    for total in (1, 7, 64, 65, 128, 129, 1000, 12345):
        chosen = [s for s in range(1, total + 1) if traced(s, total)]
        assert chosen[0] == 1 and len(chosen) <= MAX_TRACED_STEPS
        gaps = {b - a for a, b in pairwise(chosen)}
        assert len(gaps) <= 1  # evenly spaced
        # Every step of a short job; of a longer one, more than half the bound.
        assert len(chosen) == total if total <= MAX_TRACED_STEPS else len(chosen) > 32
    assert all(traced(s, 64) for s in range(1, 65))  # a short job: every step


def test_a_long_job_traces_a_bounded_sample_of_its_steps(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    s = Socket("rdu-n0-s0", RACK, tracer_provider=provider)
    # Timing mode on a preset: 200 steps of DDP's compute, no numbers, no loss.
    w = TrainingWorkload(model="llama3.2-1b", world_size=1, global_batch=1, steps=200)
    try:
        s.reserve(JOB)
        for _ in range(4):
            s.train(JOB, w, [s.name], steps=50)
    finally:
        s.close()
    done = exporter.get_finished_spans()
    steps = _named(done, names.SPAN_TRAIN_STEP)
    assert [_a(x)[names.ATTR_STEP] for x in steps] == list(range(1, 201, 4))  # k = 4
    segments = _named(done, names.SPAN_TRAIN)
    assert sum(_a(x)[names.ATTR_STEPS_UNTRACED] for x in segments) == 200 - len(steps)
    assert all(names.ATTR_LOSS not in _a(x) for x in steps)  # timing mode computes none
    # A preset holds its planned memory all along: the same peak every step.
    assert len({_a(x)[names.ATTR_PEAK_BYTES.format(tier="hbm")] for x in steps}) == 1
    assert _named(done, names.SPAN_TRAIN_ALLREDUCE) == []  # one rank: nothing to reduce
