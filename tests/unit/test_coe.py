"""Composition-of-Experts serving: the bundle on a socket, the engine, and functional
TP generation on real sockets (plain classes, real gRPC links, no Ray)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.jobs import JobSpec
from rdurack.orchestrator.results import CoeResult
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.memory import TieredMemory
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.rack.spec import Tier
from rdurack.v1 import job_pb2
from rdurack.wire import jobs as job_convert
from rdurack.wire.programs import run_from_proto, run_to_proto
from rdurack.workloads.coe.bundle import BundleShare, PredictedReplicas
from rdurack.workloads.coe.engine import CoeEngine
from rdurack.workloads.coe.report import CoeOutOfMemory, CoeReport, ReplicaFailed
from rdurack.workloads.coe.router import Router, tokenize
from rdurack.workloads.coe.spec import CoeWorkload, PoissonLoad, TraceRequest, build_requests
from rdurack.workloads.predictor import CoeSetting, Predictor, predict_coe, switch_time_s
from rdurack.workloads.program import Deploy, Generate, Kernel, Op, ProgramRun, Switch, combine
from rdurack.workloads.tiny_lm.generation import reference_generate
from rdurack.workloads.tiny_lm.model import TinyLM, TinyLMConfig

MODELS = builtin_models()
RACK = platform("sn40l-rack16")
LLAMA = MODELS["llama2-7b"]
SHARE = -(-LLAMA.weight_bytes // 8)  # one expert's bytes per socket, TP8


def engine_run(w: CoeWorkload, name: str = "sn40l-rack16", replicas: int = 1) -> CoeReport:
    p = platform(name)
    router = Router.for_catalog(w.num_experts)
    tp = w.tensor_parallel or p.node.sockets
    engine = CoeEngine(
        w, p, MODELS, router.names, PredictedReplicas(p, MODELS, tp), range(replicas)
    )
    return engine.run(build_requests(w, router))


# ------------------------------------------------------------------ the bundle on a socket


def share(region_experts: int, pinned: Sequence[str] = ()) -> BundleShare:
    names = tuple(f"e{i}" for i in range(10))
    op = Deploy(
        RACK.name, "llama2-7b", "llama2-7b", names, tuple(pinned), 0, region_experts * SHARE
    )
    s = BundleShare(op, RACK, TieredMemory("rdu-n0-s0", RACK.socket), EmulatedClock(), 8, MODELS)
    s.deploy()
    return s


def test_switching_evicts_least_recently_used_by_bytes() -> None:
    s = share(region_experts=3)
    for name in ("e0", "e1", "e2"):
        assert s.switch(Switch(name)).hit is False
    assert s.switch(Switch("e0")).hit is True  # e0 is now the most recently used
    run = s.switch(Switch("e3"))
    assert run.evicted == ("e1",) and run.loaded_bytes == SHARE
    assert s.resident() == ("e2", "e0", "e3")
    # A switch costs the expert's share over the socket's DDR->HBM rate, under the node cap.
    assert run.end_ns - run.start_ns == pytest.approx(
        switch_time_s(RACK, LLAMA.weight_bytes, 8) * 1e9, abs=1
    )


def test_pinned_experts_stay_and_take_hbm_outside_the_region() -> None:
    s = share(region_experts=1, pinned=("e9",))
    assert s.resident() == ("e9",)
    for name in ("e0", "e1"):
        s.switch(Switch(name))
    assert s.switch(Switch("e9")).hit is True
    assert s.resident() == ("e9", "e1")
    hbm = s.memory.used_bytes(Tier.HBM)
    assert hbm == -(-LLAMA.weight_bytes // 8) + SHARE + SHARE  # router + pin + region


def test_the_catalog_lives_in_ddr_and_overflow_names_the_numbers() -> None:
    s = share(region_experts=2)
    assert s.memory.used_bytes(Tier.DDR) == 10 * SHARE
    too_many = tuple(f"x{i}" for i in range(1000))  # ~1.7 TB per socket of 1.5 TB DDR
    op = Deploy(RACK.name, "llama2-7b", "llama2-7b", too_many)
    big = BundleShare(op, RACK, TieredMemory("rdu-n0-s0", RACK.socket), EmulatedClock(), 8, MODELS)
    with pytest.raises(OutOfMemory) as e:
        big.deploy()
    assert e.value.tier == "ddr" and "1000 x llama2-7b" in str(e.value) and "fit" in str(e.value)


# ------------------------------------------------------------------ the engine


@pytest.mark.parametrize("name", ["sn40l-node", "dgx-a100", "dgx-h100"])
def test_the_engine_agrees_with_the_closed_form_predictor(name: str) -> None:
    """PAPER Table V's batch: the serving engine and predict_coe give the same time."""
    plan = FusionPlan.FUSED_HO if name.startswith("sn40l") else None
    report = engine_run(CoeWorkload(num_experts=100, decode_plan=plan), name)
    closed = predict_coe(
        Predictor(platform(name)), CoeSetting(experts=100, decode_plan=plan), MODELS
    )
    assert closed.total_s is not None and closed.switch_s is not None
    assert report.emulated_s == pytest.approx(closed.total_s, rel=1e-6)
    assert report.switch_s == pytest.approx(closed.switch_s, rel=1e-6)
    assert report.switches == 8 and report.hbm_hit_rate == 0.0 and report.requests == 8


def test_150_experts_fit_an_sn40l_node_and_not_a_dgx() -> None:
    assert not engine_run(CoeWorkload(num_experts=150), "sn40l-node").oom
    for name in ("dgx-a100", "dgx-h100"):
        with pytest.raises(CoeOutOfMemory) as e:
            engine_run(CoeWorkload(num_experts=150), name)
        assert e.value.report.oom and "host DRAM" in e.value.report.oom_reason
        assert "143 fit" in e.value.report.oom_reason


def test_requests_of_one_expert_share_a_switch_and_per_request_figures_add_up() -> None:
    hints = ["coding-python", "coding-python", "math-algebra"]
    w = CoeWorkload(prompts=["a", "b", "c"], expert_hints=hints, output_tokens=5)
    r = engine_run(w)
    assert r.switches == 2 and r.switches_per_expert == {"coding-python": 1, "math-algebra": 1}
    first, second, third = r.per_request
    assert first.switch_s == second.switch_s > 0 and first.e2e_s == second.e2e_s
    assert third.e2e_s > first.e2e_s  # the second group runs after the first
    for q in r.per_request:
        assert q.ttft_s < q.e2e_s and q.tpot_s == pytest.approx((q.e2e_s - q.ttft_s) / 4)
    assert r.emulated_s == pytest.approx(max(q.e2e_s for q in r.per_request))
    assert r.tokens == 15 and r.tokens_per_s == pytest.approx(15 / r.emulated_s)


def test_the_default_router_routes_prompts_by_their_text() -> None:
    w = CoeWorkload(prompts=["fix this python function that raises a KeyError"])
    assert engine_run(w).per_request[0].expert.startswith("coding")


def test_a_trace_replays_at_its_arrival_times() -> None:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=100, expert="law-contracts"),
        TraceRequest(arrival_s=10.0, prompt_tokens=100, expert="law-contracts"),
    ]
    r = engine_run(CoeWorkload(trace=trace, routing="hint"))
    a, b = r.per_request
    assert not a.hit and b.hit  # the second finds its expert still in HBM
    assert b.arrival_s == 10.0 and b.switch_s == 0.0
    assert r.emulated_s == pytest.approx(10.0 + b.e2e_s)


def test_cache_aware_routing_switches_less_than_random_on_a_skewed_trace() -> None:
    # 20 requests/s: under heavier load the replicas' queues grow and the two policies'
    # switch counts converge (at 40/s: 355 against 423; at 20/s: 316 against 421).
    load = PoissonLoad(requests=600, rate_per_s=20.0, skew=1.1, seed=3)
    # A small region (4 experts per replica) makes placement matter.
    base = {"num_experts": 60, "poisson": load, "num_sockets": 16, "reserved_hbm_bytes": 4 * SHARE}
    aware = engine_run(CoeWorkload(**base, node_routing="cache-aware"), replicas=2)
    random = engine_run(CoeWorkload(**base, node_routing="random"), replicas=2)
    assert aware.requests == random.requests == 600
    assert aware.switches < 0.8 * random.switches, (aware.switches, random.switches)
    assert aware.hbm_hit_rate > random.hbm_hit_rate


def test_pinning_idle_experts_starves_the_kv_cache_and_is_diagnosed() -> None:
    # 35 pinned experts fill the HBM: 8 prompts of one expert no longer fit one batch.
    pinned = Router.for_catalog(150).names[1:36]
    w = CoeWorkload(
        prompts=["x" * 4000] * 8,
        expert_hints=["0"] * 8,
        routing="hint",
        pinned_experts=pinned,
        output_tokens=50,
    )
    starved = engine_run(w)
    fine = engine_run(w.model_copy(update={"pinned_experts": []}))
    assert starved.emulated_s > fine.emulated_s and not fine.diagnostics
    (diagnostic,) = starved.diagnostics
    assert "KV cache was starved" in diagnostic and "pinned expert" in diagnostic
    assert "Fix: drop them from pinned_experts" in diagnostic
    # What the diagnostic says the waves cost is what they cost: the difference between
    # the runs, less the pins' loading at deploy.
    extra = float(diagnostic.split("cost ")[1].split(" s")[0])
    pins_s = 35 * switch_time_s(RACK, LLAMA.weight_bytes, 8)
    assert extra == pytest.approx(starved.emulated_s - fine.emulated_s - pins_s, rel=0.01)


def test_hint_policy_needs_hints_and_names_unknown_experts() -> None:
    with pytest.raises(InvalidRequest, match="needs an expert hint"):
        engine_run(CoeWorkload(prompts=["a"], routing="hint"))
    with pytest.raises(Exception, match="no-such-expert"):
        engine_run(CoeWorkload(prompts=["a"], expert_hints=["no-such-expert"]))


# ------------------------------------------------------------------ functional, on sockets


@pytest.fixture
def node() -> Iterator[list[Socket]]:
    ids = [f"rdu-n0-s{i}" for i in range(4)]
    made = [Socket(i, RACK, timeout_s=10.0) for i in ids]
    peers = {s.name: s.address() for s in made}
    for s in made:
        s.connect(peers)
        s.reserve("job")
    yield made
    for s in made:
        s.close()


def run_all(sockets: list[Socket], ops: Sequence[Op]) -> ProgramRun:
    group = [s.name for s in sockets]
    with ThreadPoolExecutor(len(sockets)) as pool:
        futures = [pool.submit(s.run_program, "job", list(ops), group) for s in sockets]
        return combine([f.result(timeout=60) for f in futures])


def test_functional_tp_generation_equals_the_single_device_reference(node: list[Socket]) -> None:
    names = ("tiny-a", "tiny-b")
    deploy = Deploy(RACK.name, "tiny-lm", "tiny-lm", names, expert_seeds=(11, 12))
    prompts = [tuple(tokenize("hello, rack")), tuple(tokenize("dataflow"))]
    ops: list[Op] = [deploy, Switch("tiny-a"), Generate("tiny-a", prompts[0], 12)]
    ops += [Switch("tiny-b"), Generate("tiny-b", prompts[1], 7)]
    run = run_all(node, ops)
    assert list(run.ops[2].tokens) == reference_generate(TinyLM(TinyLMConfig(), 11), prompts[0], 12)
    assert list(run.ops[4].tokens) == reference_generate(TinyLM(TinyLMConfig(), 12), prompts[1], 7)
    # Generation takes no emulated time of its own: Kernel ops carry it, as in timing mode.
    assert run.ops[2].start_ns == run.ops[2].end_ns


def test_a_program_takes_the_time_of_its_kernels(node: list[Socket]) -> None:
    deploy = Deploy(RACK.name, "llama2-7b", "llama2-7b", ("a",))
    kernel = Kernel("llama2-7b", Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, steps=19)
    run = run_all(node, [deploy, Switch("a"), kernel])
    t = Predictor(RACK).step(LLAMA, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 4)
    assert run.ops[2].end_ns - run.ops[2].start_ns == pytest.approx(19 * t.total_s * 1e9, abs=2)
    # Each socket's share of the FLOPs, every step, carried to the orchestrator's side.
    assert run.ops[2].flops == int(19 * t.flops) > 0
    ops: list[Op] = [deploy, Switch("a"), kernel]
    assert run_from_proto(run_to_proto(run), ops) == run
    assert run.resident == ("a",)
    with pytest.raises(InvalidRequest, match="already deployed"):
        node[0].run_program("job", [deploy], [s.name for s in node])


def test_a_dgx_job_loads_the_dgx_spec_onto_the_socket_for_its_duration(
    node: list[Socket],
) -> None:
    dgx = platform("dgx-a100")
    run_all(node, [Deploy(dgx.name, "llama2-7b", "llama2-7b", ("a", "b"))])
    tiers = node[0].state().tiers
    assert tiers["hbm"].capacity_bytes == dgx.socket.hbm.capacity_bytes
    for s in node:
        s.release("job")
    assert node[0].state().tiers["hbm"].capacity_bytes == RACK.socket.hbm.capacity_bytes


# ------------------------------------------------------------------ on the wire


def test_a_coe_spec_and_its_result_round_trip_through_the_proto() -> None:
    w = CoeWorkload(
        num_experts=40,
        trace=[
            TraceRequest(arrival_s=0.0, prompt="hello", expert="coding-python"),
            TraceRequest(arrival_s=1.0, prompt_tokens=300, output_tokens=4),
        ],
        pinned_experts=["math-algebra"],
        decode_plan=FusionPlan.FUSED_HO,
        num_sockets=16,
        reserved_hbm_bytes=7 * SHARE,
        seed=2**40,
    )
    spec = JobSpec(workload=w, platform="sn40l-rack16")
    assert job_convert.spec_from_proto(job_convert.spec_to_proto(spec), "x") == spec
    zero_skew = CoeWorkload(poisson=PoissonLoad(requests=5, rate_per_s=1.0, skew=0.0))
    back = job_convert.spec_from_proto(job_convert.spec_to_proto(JobSpec(workload=zero_skew)), "")
    assert back.workload == zero_skew  # an explicit 0 survives proto3's zero-is-unset
    report = engine_run(CoeWorkload(prompts=["a", "b"], output_tokens=3))
    result = job_convert.result_to_proto(CoeResult.model_validate(report.model_dump()))
    r = result.coe_inference
    assert r.requests == 2 and r.emulated_s == report.emulated_s
    assert [q.expert for q in r.per_request] == [q.expert for q in report.per_request]


def test_a_bad_coe_spec_names_its_field() -> None:
    spec = job_pb2.JobSpec(coe_inference=job_pb2.CoeInferenceJob(batch_size=0, routing="fastest"))
    with pytest.raises(InvalidRequest, match=r"spec\.coe_inference\.routing"):
        job_convert.spec_from_proto(spec, "sn40l-rack16")


# ------------------------------------------------------------------ a replica fails


class FailingReplicas:
    """PredictedReplicas whose replica `dies` fails from its `after`-th program on."""

    def __init__(self, inner: PredictedReplicas, dies: int, after: int) -> None:
        self.inner, self.dies, self.after = inner, dies, after
        self.calls = 0

    def run(self, replica: int, ops: Sequence[Op], start_ns: int) -> ProgramRun:
        if replica == self.dies:
            self.calls += 1
            if self.calls > self.after:
                raise ReplicaFailed(replica, "rdu-n1-s0 died")
        return self.inner.run(replica, ops, start_ns)


def test_a_failed_replicas_requests_are_rerouted_and_each_is_served_once() -> None:
    w = CoeWorkload(num_experts=20, batch_size=4, poisson=PoissonLoad(requests=40, rate_per_s=400))
    p = platform("sn40l-rack16")
    router = Router.for_catalog(w.num_experts)
    whole = engine_run(w, replicas=2)
    executor = FailingReplicas(PredictedReplicas(p, MODELS, 8), dies=1, after=2)  # deploy + 1
    report = CoeEngine(w, p, MODELS, router.names, executor, range(2)).run(
        build_requests(w, router)
    )
    assert sorted(r.index for r in report.per_request) == list(range(40))  # none lost, none twice
    assert report.failed_replicas == (1,)
    moved = [r for r in report.per_request if r.rerouted]
    assert report.rerouted_requests == len(moved) > 0
    assert all(r.replica == 0 for r in moved)  # served by the replica left
    served_by_1 = [r for r in report.per_request if r.replica == 1]
    assert served_by_1 and not any(r.rerouted for r in served_by_1)  # its first batch stands
    assert any("replica 1 failed" in d and "re-routed" in d for d in report.diagnostics)
    # One replica does the rest: the job takes longer than with both.
    assert report.emulated_s > whole.emulated_s


def test_the_last_replica_failing_fails_the_job() -> None:
    w = CoeWorkload(num_experts=10, batch_size=4, poisson=PoissonLoad(requests=8, rate_per_s=400))
    p = platform("sn40l-node")
    router = Router.for_catalog(w.num_experts)
    executor = FailingReplicas(PredictedReplicas(p, MODELS, 8), dies=0, after=1)
    with pytest.raises(ReplicaFailed, match="rdu-n1-s0 died"):
        CoeEngine(w, p, MODELS, router.names, executor, range(1)).run(build_requests(w, router))
