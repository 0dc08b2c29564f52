"""Mixture-of-experts models: routing loads, the layer's per-socket figures under each
expert mapping, MLA's latent cache, FP8 weights, and placement by tier."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.jobs import KernelWorkload
from rdurack.rack.kernels import FusionPlan, Phase, step
from rdurack.rack.layers import UPCAST_FLOPS_PER_WEIGHT, expert_mapping
from rdurack.rack.models import (
    ExpertMapping,
    ModelSpec,
    MoeSpec,
    WeightFormat,
    builtin_models,
    model,
)
from rdurack.rack.placement import place, routed_expert_bytes
from rdurack.rack.presets import platform
from rdurack.rack.routing import expert_load, touched
from rdurack.rack.spec import Tier
from rdurack.v1 import common_pb2, job_pb2
from rdurack.wire.jobs import spec_from_proto, spec_to_proto
from rdurack.workloads.predictor import Predictor, predict_decode
from rdurack.workloads.serving.batch import ServeRequest, resolve
from rdurack.workloads.serving.costs import Cost, iteration_cost
from tests.support.cli import rdu, rdu_json

R1 = model("deepseek-r1")
MIXTRAL = model("mixtral-8x7b")
RACK = platform("sn40l-rack16")


def _mapped(m: ModelSpec, mapping: ExpertMapping) -> ModelSpec:
    assert m.moe is not None
    return m.model_copy(update={"moe": m.moe.model_copy(update={"mapping": mapping})})


def _layer_op(m: ModelSpec, name: str, batch: int = 1, tp: int = 16, cold: float = 0.0) -> float:
    """Weight bytes one socket reads for op `name` of an MoE layer in one decode step."""
    s = step(m, Phase.DECODE, batch, 1024, tp, cold_experts=cold)
    (layer,) = [b for b, _ in s.blocks if b.name == "moe_layer"]
    return sum(op.weight_bytes for op in layer.ops if op.name == name)


# ------------------------------------------------------------------ routing


def test_expected_experts_touched() -> None:
    assert R1.moe is not None
    assert touched(R1.moe, 1) == pytest.approx(8)
    # Two tokens: 256 x (1 - (1 - 8/256)^2) = 15.75, a few experts shared.
    assert touched(R1.moe, 2) == pytest.approx(15.75)
    assert touched(R1.moe, 10_000) == pytest.approx(256)


def test_the_busiest_socket_runs_more_than_the_mean_and_sampling_is_repeatable() -> None:
    assert R1.moe is not None
    load = expert_load(R1.moe, 1, 16)
    # Eight experts over 16 sockets: half an expert each on average, but the busiest
    # socket runs at least one, and often two (group-limited routing packs them).
    assert 1.5 < load.busiest_experts < 3.5
    assert load.busiest_assignments == load.busiest_experts  # one token: one pair each
    assert expert_load(R1.moe, 1, 16) == load  # seeded: the same figure every run
    many = expert_load(R1.moe, 5000, 16)
    assert many.busiest_experts == 16 and many.busiest_assignments == pytest.approx(2500)


def test_group_limited_routing_packs_a_token_onto_fewer_sockets() -> None:
    assert R1.moe is not None
    free = R1.moe.model_copy(update={"expert_groups": 1, "groups_per_token": 1})
    assert expert_load(R1.moe, 1, 16).busiest_experts > expert_load(free, 1, 16).busiest_experts


# ------------------------------------------------------------------ the layer


def test_expert_parallel_reads_whole_experts_of_the_busiest_socket() -> None:
    assert R1.moe is not None
    ep = _mapped(R1, ExpertMapping.EXPERT_PARALLEL)
    busiest = expert_load(R1.moe, 1, 16).busiest_experts
    expert = R1.expert_params * R1.matrix_bytes_per_param
    read = _layer_op(ep, "experts_up") + _layer_op(ep, "experts_down")
    assert read == pytest.approx(busiest * expert)


def test_tensor_parallel_reads_a_slice_of_every_touched_expert() -> None:
    tp = _mapped(R1, ExpertMapping.TENSOR_PARALLEL)
    expert = R1.expert_params * R1.matrix_bytes_per_param
    read = _layer_op(tp, "experts_up") + _layer_op(tp, "experts_down")
    assert read == pytest.approx(8 * expert / 16)
    # The shared expert splits like a dense MLP.
    shared = _layer_op(tp, "shared_up") + _layer_op(tp, "shared_down")
    assert shared == pytest.approx(expert / 16)


def test_default_mapping_is_expert_parallel_where_experts_divide() -> None:
    assert expert_mapping(R1, 16) is ExpertMapping.EXPERT_PARALLEL
    assert expert_mapping(MIXTRAL, 16) is ExpertMapping.TENSOR_PARALLEL  # 8 experts
    assert expert_mapping(model("llama3.1-8b"), 8) is None
    with pytest.raises(InvalidRequest, match="do not divide over 16 sockets"):
        step(_mapped(MIXTRAL, ExpertMapping.EXPERT_PARALLEL), Phase.DECODE, 1, 16, 16)


def test_fp8_weights_move_half_the_bytes_and_pay_the_upcast() -> None:
    bf16 = R1.model_copy(update={"weight_format": WeightFormat.NATIVE})
    fp8_read, bf16_read = _layer_op(R1, "o_proj"), _layer_op(bf16, "o_proj")
    assert fp8_read / bf16_read == pytest.approx((1 + 4 / 128**2) / 2)
    s8, s16 = (step(m, Phase.DECODE, 1, 1024, 16) for m in (R1, bf16))
    o8, o16 = (
        next(op for b, _ in s.blocks for op in b.ops if op.name == "o_proj") for s in (s8, s16)
    )
    assert o8.flops - o16.flops == pytest.approx(UPCAST_FLOPS_PER_WEIGHT * o16.weight_bytes / 2)


def test_mla_decode_reads_the_whole_latent_on_every_socket() -> None:
    s = step(R1, Phase.DECODE, 4, 2048, 16)
    (layer,) = [b for b, _ in s.blocks if b.name == "moe_layer"]
    kv = sum(op.kv_bytes for op in layer.ops)
    # The cache read (4 sequences x 2048 tokens x 576 values x 2 bytes) and the new
    # tokens' latents appended: not split by the 16 sockets.
    assert kv == pytest.approx(4 * 2048 * 576 * 2 + 4 * 576 * 2)
    assert "q_absorb" in {op.name for op in layer.ops}  # decode runs absorbed
    prefill = step(R1, Phase.PREFILL, 1, 512, 16)
    assert "kv_up" in {op.name for b, _ in prefill.blocks for op in b.ops}


def test_dense_layers_come_first_and_both_loop() -> None:
    s = step(R1, Phase.DECODE, 1, 1024, 16)
    assert [(b.name, n) for b, n in s.blocks] == [
        ("embedding", 1), ("decoder_layer", 3), ("moe_layer", 58), ("lm_head", 1),
    ]  # fmt: skip
    timing = Predictor(RACK).step(R1, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 16)
    assert timing.kernel_calls == 4  # embedding, two loops, head


# ------------------------------------------------------------------ placement


def test_deepseek_fits_the_rack_hbm_in_fp8_with_no_expert_in_ddr() -> None:
    p = place(R1, RACK, 16, 1024)
    assert p.experts_ddr_bytes == 0 and p.cold_experts == 0
    assert p.hbm_bytes < RACK.socket.hbm.capacity_bytes


def test_experts_beyond_hbm_stay_in_ddr_and_are_copied_in_when_touched() -> None:
    bf16 = R1.model_copy(update={"weight_format": WeightFormat.NATIVE})  # 1.34 TB: over 1 TB of HBM
    p = place(bf16, RACK, 16, 1024)
    per_socket = routed_expert_bytes(bf16) / 16
    assert p.experts_ddr_bytes == pytest.approx(per_socket * p.cold_experts, rel=1e-6)
    assert 0.2 < p.cold_experts < 0.4
    assert p.hbm_bytes == RACK.socket.hbm.capacity_bytes  # the experts fill what is left
    cold = step(bf16, Phase.DECODE, 1, 1024, 16, cold_experts=p.cold_experts)
    copied = sum(op.ddr_bytes for b, n in cold.blocks for op in b.ops)
    assert copied == pytest.approx(p.cold_experts * _layer_op(bf16, "experts_up") * 1 +
                                   p.cold_experts * _layer_op(bf16, "experts_down"))  # fmt: skip
    slow = predict_decode(Predictor(RACK), bf16, 1, 16, 1024)
    fast = predict_decode(Predictor(RACK), R1, 1, 16, 1024)
    assert slow.placement["cold_experts"] == pytest.approx(p.cold_experts)
    assert slow.tokens_per_s_per_user < fast.tokens_per_s_per_user / 2


def test_one_socket_serves_deepseek_from_its_ddr() -> None:
    # 19 GB of attention, dense layers and shared experts in HBM; the routed experts
    # fill the rest of it, and 609 GB of them wait in the socket's 1.5 TB of DDR.
    p = place(R1, RACK, 1, 1024)
    assert 0.9 < p.cold_experts < 0.95
    assert p.experts_ddr_bytes < RACK.socket.ddr.capacity_bytes


def test_too_big_for_a_tier_is_refused_with_its_numbers() -> None:
    # What must be in HBM (attention, dense layers, a KV cache of a million tokens).
    with pytest.raises(OutOfMemory, match=r"HBM cannot hold .* deepseek-r1 on 1 \(its routed"):
        place(R1, RACK, 1, 1_000_000)
    huge = R1.model_copy(
        update={"moe": MoeSpec(routed_experts=16384, active_experts=8, expert_ffn=2048,
                               shared_experts=1, dense_layers=3)}
    )  # fmt: skip
    with pytest.raises(OutOfMemory, match="DDR cannot hold"):
        place(huge, RACK, 16, 1024)


# ------------------------------------------------------------------ the command line


def test_rdu_predict_decode_answers_for_deepseek_with_its_placement() -> None:
    d = rdu_json("predict", "decode", "--platform", "sn40l-rack16", "--model", "deepseek-r1")
    assert d["expert_mapping"] == "expert-parallel"
    assert d["placement"]["sockets"] == 16 and d["placement"]["experts_ddr_bytes"] == 0
    assert d["tokens_per_s_per_user"] > 0 and 0 < d["hbm_bandwidth_utilization"] < 1
    tp = rdu_json(
        "predict", "decode", "--platform", "sn40l-rack16", "--model", "deepseek-r1",
        "--expert-mapping", "tensor-parallel",
    )  # fmt: skip
    assert tp["expert_mapping"] == "tensor-parallel"


def test_expert_mapping_of_a_dense_model_is_refused() -> None:
    done = rdu("predict", "decode", "--platform", "sn40l-node", "--model", "llama3.1-8b",
               "--expert-mapping", "tensor-parallel")  # fmt: skip
    assert done.returncode == 2 and "has no experts" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_decode_steps_breakdown_adds_up_to_what_it_moves() -> None:
    r = predict_decode(Predictor(RACK), R1, 1, 16, 1024)
    b = r.breakdown
    parts = [k for k in b if k.endswith("_bytes") and k != "ddr_copy_bytes"]
    moved = r.hbm_bandwidth_utilization * r.step_s * RACK.socket.hbm.bandwidth_bytes_per_s
    assert sum(b[k] for k in parts) == pytest.approx(moved)
    # At batch 1 the busiest socket's routed experts are most of what a step reads.
    assert b["routed_experts_bytes"] > 0.6 * moved
    assert b["dense_mlp_bytes"] > 0 and b["router_bytes"] > 0 and b["ddr_copy_bytes"] == 0


def test_a_batch_size_study_lists_rows_and_the_groups_capacity() -> None:
    d = rdu_json(
        "predict", "decode", "--platform", "sn40l-rack16", "--model", "deepseek-r1",
        "--context", "2048", "--batch-sizes", "1,8,256",
    )  # fmt: skip
    assert [r["batch"] for r in d["rows"]] == [1, 8, 256]
    per_user = [r["tokens_per_s_per_user"] for r in d["rows"]]
    assert per_user == sorted(per_user, reverse=True)
    cap = d["capacity"]
    # The whole latent cache on every socket: at 2,048 tokens, 144 users keep every
    # expert in HBM; past that experts go to DDR, and 256 users push 39% of them there.
    assert cap["max_batch_experts_in_hbm"] < 256 < cap["max_batch"]
    assert d["rows"][2]["placement"]["cold_experts"] > 0.3
    done = rdu("predict", "decode", "--platform", "sn40l-rack16", "--model", "deepseek-r1",
               "--batch-sizes", "0,8")  # fmt: skip
    assert done.returncode == 2 and "positive integers" in done.stderr


def test_a_socket_holds_its_placement_by_tier() -> None:
    """What `rdu status` shows of a socket running an MoE kernel: weights and KV cache in
    HBM, the experts beyond it in DDR, as rack/placement.py places them."""
    s = Socket("rdu-n0-s0", RACK)
    try:
        s.reserve("moe-job")
        run = s.run_kernel("moe-job", R1, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 1)
        p = place(R1, RACK, 1, 1024)
        tiers = s.memory.snapshot().tiers
        assert tiers[Tier.HBM].used_bytes == p.hbm_bytes
        assert tiers[Tier.DDR].used_bytes == p.experts_ddr_bytes > 0
        step = Predictor(RACK).step(R1, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 1)
        assert run.end_ns - run.start_ns == pytest.approx(step.total_s * 1e9, abs=2)
    finally:
        s.close()


def test_a_serve_batch_prices_every_step_with_its_final_placement() -> None:
    """The sockets hold the batch's placement at its final KV cache from the start, so
    every decode step copies in the experts that placement leaves in DDR."""
    p = Predictor(RACK)
    b = resolve(ServeRequest("deepseek-r1", 256, 1024, 1024), RACK, builtin_models())
    (cold,) = b.cold_experts
    assert cold > 0.3  # 256 x 2048 tokens of latent on every socket
    now = p.step(R1, Phase.DECODE, b.plan, 256, 1501, 16)  # as this step's cache leaves them
    final = p.step(R1, Phase.DECODE, b.plan, 256, 1501, 16, cold)
    assert iteration_cost(p, b, 1500) == Cost.of(final)
    assert final.total_s > now.total_s


# ------------------------------------------------------------------ on the wire


def _moe_spec(mapping: int) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        platform="sn40l-rack16",
        kernel=job_pb2.KernelJob(
            model="deepseek-r1",
            phase=common_pb2.PHASE_DECODE,
            sequence_length=1024,
            num_sockets=16,
            output_tokens=4,
            expert_mapping=mapping,  # type: ignore[arg-type]
        ),
    )


def test_a_kernel_jobs_expert_mapping_round_trips() -> None:
    spec = spec_from_proto(_moe_spec(common_pb2.EXPERT_MAPPING_TENSOR_PARALLEL), "sn40l-rack16")
    assert isinstance(spec.workload, KernelWorkload)
    assert spec.workload.expert_mapping is ExpertMapping.TENSOR_PARALLEL
    assert spec_to_proto(spec).kernel.expert_mapping == common_pb2.EXPERT_MAPPING_TENSOR_PARALLEL
    unset = spec_from_proto(_moe_spec(common_pb2.EXPERT_MAPPING_UNSPECIFIED), "sn40l-rack16")
    assert isinstance(unset.workload, KernelWorkload) and unset.workload.expert_mapping is None
    with pytest.raises(InvalidRequest, match=r"spec\.kernel\.expert_mapping: 7 is not one of"):
        spec_from_proto(_moe_spec(7), "sn40l-rack16")


def test_a_serve_request_places_its_targets_experts() -> None:
    request = ServeRequest("deepseek-r1", 1, 128, 8, expert_mapping=ExpertMapping.TENSOR_PARALLEL)
    b = resolve(request, RACK, builtin_models())
    assert expert_mapping(b.target, 16) is ExpertMapping.TENSOR_PARALLEL
    dense = ServeRequest("llama3.1-8b", 1, 128, 8, expert_mapping=ExpertMapping.TENSOR_PARALLEL)
    with pytest.raises(InvalidRequest, match=r"llama3\.1-8b has no experts to place"):
        resolve(dense, RACK, builtin_models())
