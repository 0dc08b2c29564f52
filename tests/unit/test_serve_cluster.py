"""A serve job on the cluster's code without Ray: Socket.serve (clock, memory, spans), the
kernel kind's serve run (prefill, then decode segments) on real Socket objects, what it
refuses, and its report against `rdu predict serve`: within 3% for every preset model
at batch 1 and 16, prompt = output in {128, 512, 2048} (tests/integration/test_serve.py
runs a few of them on the real cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.jobs import JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.results import KernelResult
from rdurack.rack.models import builtin_models
from rdurack.rack.spec import Tier
from rdurack.telemetry import names
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeRequest, resolve
from rdurack.workloads.serving.costs import decode_cost, prefill_cost
from rdurack.workloads.serving.predict import predict_serve
from rdurack.workloads.serving.speculative import DRAFT_MODELS, SpeculativeSetting
from tests.support.fake_rack import RACK, stepped, wait_for
from tests.support.serving import assert_agree
from tests.support.socket_rack import SocketGateway

MODELS = builtin_models()
JOB = "job-serve"


def _sockets(model: str) -> int:
    """The whole rack where TP over 16 divides the model, else a node."""
    m = MODELS[model]
    return 16 if m.heads % 16 == 0 and m.ffn % 16 == 0 else 8


GRID = [
    (model, batch, tokens, False)
    for model in sorted(MODELS)
    for batch in (1, 16)
    for tokens in (128, 512, 2048)
] + [(model, batch, 512, True) for model in sorted(DRAFT_MODELS) for batch in (1, 16)]


def _workload(model: str, batch: int, tokens: int, speculative: bool) -> KernelWorkload:
    return KernelWorkload(
        model=model,
        phase="serve",
        sequence_length=tokens,
        output_tokens=tokens,
        batch_size=batch,
        num_sockets=_sockets(model),
        speculative=SpeculativeSetting() if speculative else None,
    )


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    """An orchestrator whose serve jobs run on Socket objects, for the whole module."""
    gateway = SocketGateway()
    path = tmp_path_factory.mktemp("serve") / "jobs.sqlite"
    try:
        with stepped(path, gateway, poll_s=0.05) as o:
            yield o
    finally:
        gateway.close()


def _run(o: Orchestrator, workload: KernelWorkload) -> KernelResult:
    job, _ = o.submit(JobSpec(workload=workload))
    assert o.schedule_once() == 1
    assert wait_for(o, job.id, timeout_s=60) is JobState.SUCCEEDED, o.get(job.id).error
    result = o.get(job.id).result
    assert isinstance(result, KernelResult) and result.serve is not None
    return result


# ------------------------------------------------------------------ agreement


def test_every_case_of_the_grid_fits_the_rack() -> None:
    """The grid leaves no preset out: every model fits at its socket count."""
    for model, batch, tokens, speculative in GRID:
        resolve(_workload(model, batch, tokens, speculative).serve_request(), RACK, MODELS)
    assert {m for m, *_ in GRID} == set(MODELS)


@pytest.mark.parametrize(
    ("model", "batch", "tokens", "speculative"),
    GRID,
    ids=[f"{m}-b{b}-{t}{'-spec' if s else ''}" for m, b, t, s in GRID],
)
def test_a_serve_job_agrees_with_predict_serve_within_3_percent(
    serving: Orchestrator, model: str, batch: int, tokens: int, speculative: bool
) -> None:
    workload = _workload(model, batch, tokens, speculative)
    result = _run(serving, workload)
    assert result.serve is not None
    predicted = predict_serve(Predictor(RACK), workload.serve_request(), MODELS)
    assert_agree(result.serve.model_dump(mode="json"), predicted.model_dump(mode="json"))
    # The job's own figures are the report's.
    assert result.emulated_s == pytest.approx(result.serve.e2e_s, rel=1e-9)
    assert result.tokens_per_s == result.serve.tokens_per_s


def test_progress_is_the_prefill_then_the_decode_segments(serving: Orchestrator) -> None:
    job, _ = serving.submit(JobSpec(workload=_workload("llama3.1-8b", 1, 128, False)))
    assert serving.schedule_once() == 1
    assert wait_for(serving, job.id) is JobState.SUCCEEDED
    progress = [e.payload for e in serving.events(job.id) if e.kind == "progress"]
    assert progress[0]["message"] == "prefill: first token"
    assert [p["message"] for p in progress[1:3]] == [
        "13 of 127 decode iterations",
        "26 of 127 decode iterations",
    ]
    assert len(progress) == 11 and progress[-1]["fraction"] == 1.0


# ------------------------------------------------------------------ refused


def test_a_batch_that_does_not_fit_is_refused_at_submission(serving: Orchestrator) -> None:
    huge = _workload("llama3.1-405b", 16, 2048, False).model_copy(update={"num_sockets": 8})
    with pytest.raises(OutOfMemory, match="sn40l-rack16 socket: HBM cannot hold"):
        serving.submit(JobSpec(workload=huge))


def test_speculation_belongs_to_serve_jobs(serving: Orchestrator) -> None:
    decode = KernelWorkload(model="llama3.1-70b", phase="decode", speculative=SpeculativeSetting())
    with pytest.raises(InvalidRequest, match=r"spec\.kernel\.speculative: .* SERVE job"):
        serving.submit(JobSpec(workload=decode))
    bad = _workload("falcon-40b", 1, 128, True)
    with pytest.raises(InvalidRequest, match="no default draft model"):
        serving.submit(JobSpec(workload=bad))


def test_a_serve_jobs_plan_is_unset_until_a_platform_resolves_it() -> None:
    w = _workload("llama2-7b", 1, 128, False)
    assert w.fusion_plan is None and w.serves
    with pytest.raises(InvalidRequest, match="not one step"):
        w.step_phase()
    assert resolve(w.serve_request(), RACK, MODELS).plan.value == "kernel-looped"
    assert KernelWorkload(model="m", phase="decode").fusion_plan is not None


# ------------------------------------------------------------------ Socket.serve


@pytest.fixture
def socket(spans: tuple[TracerProvider, InMemorySpanExporter]) -> Iterator[Socket]:
    s = Socket("rdu-n0-s0", RACK, tracer_provider=spans[0])
    s.reserve(JOB)
    yield s
    s.close()


def test_socket_serve_advances_its_clock_by_the_predicted_costs(
    socket: Socket, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    request = ServeRequest("llama3.1-70b", 4, 256, 65, sockets=8, speculative=SpeculativeSetting())
    p = Predictor(RACK)
    batch = resolve(request, RACK, MODELS)
    prefill = socket.serve(JOB, request, 0, 1)
    assert prefill.duration_ns == pytest.approx(prefill_cost(p, batch).seconds * 1e9, abs=1)
    rest = socket.serve(JOB, request, 1, batch.iterations, start_ns=prefill.end_ns + 1000)
    assert rest.start_ns == prefill.end_ns + 1000  # it met the caller's start
    decode = decode_cost(p, batch, 0, batch.iterations)
    assert rest.duration_ns == pytest.approx(decode.seconds * 1e9, abs=1)
    assert rest.hbm_bytes == round(decode.hbm_bytes) and rest.launch_ns > 0
    # The target's and the draft's weights and final KV caches are held in HBM.
    assert socket.memory.used_bytes(Tier.HBM) == batch.held_per_socket()
    exported = spans[1].get_finished_spans()
    named = {s.name: s for s in exported}
    assert set(named) == {names.SPAN_SERVE_PREFILL, names.SPAN_SERVE_DECODE}
    attributes = named[names.SPAN_SERVE_DECODE].attributes or {}
    assert attributes[names.ATTR_STEPS] == batch.iterations
    assert attributes[names.ATTR_SERVE_FIRST_ITERATION] == 0
    assert attributes[names.ATTR_DRAFT_MODEL] == "llama3.1-8b"
    assert attributes[names.ATTR_JOB_PHASE] == "serve"
    assert attributes[names.ATTR_FUSION_PLAN] == "kernel-looped"
    assert (named[names.SPAN_SERVE_PREFILL].attributes or {})[names.ATTR_FUSION_PLAN] == "fused-ho"


def test_socket_serve_is_slowed_and_refuses_steps_the_batch_lacks(socket: Socket) -> None:
    request = ServeRequest("llama2-7b", 1, 128, 9, sockets=8)
    first = socket.serve(JOB, request, 0, 3)  # the prefill and two decode steps at once
    socket.slow(2.0)
    again = socket.serve(JOB, request, 0, 3)
    assert again.duration_ns == pytest.approx(2 * first.duration_ns, abs=2)
    with pytest.raises(InvalidRequest, match="not steps of this batch"):
        socket.serve(JOB, request, 5, 9)


def test_serve_needs_the_socket_reserved(tmp_path: Path) -> None:
    s = Socket("rdu-n0-s1", RACK)
    try:
        with pytest.raises(InvalidRequest, match="reserve it first"):
            s.serve(JOB, ServeRequest("llama2-7b", 1, 8, 8, sockets=8), 0, 1)
    finally:
        s.close()
