"""The fast predictor against the paper's claims (issue acceptance) and its guards."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import builtin_models, model
from rdurack.rack.presets import builtin_platforms, platform
from rdurack.workloads.paper.table_v import TABLE_V_DECODE_PLAN
from rdurack.workloads.predictor import (
    CoeSetting,
    Predictor,
    expert_capacity,
    predict_coe,
    predict_decode,
    predict_footprint,
    predict_fusion,
    switch_time_s,
)

MODELS = builtin_models()
PRED = {name: Predictor(p) for name, p in builtin_platforms().items()}


def coe(name: str, **kw: object) -> object:
    return predict_coe(PRED[name], CoeSetting(**kw), MODELS)  # type: ignore[arg-type]


def test_table_v_speedups_within_10_percent() -> None:
    # The SN40L decodes as Table V is reproduced (workloads/paper/table_v.py says why).
    table_v = CoeSetting(experts=100, decode_plan=TABLE_V_DECODE_PLAN)
    sn = predict_coe(PRED["sn40l-node"], table_v, MODELS)
    a100 = predict_coe(PRED["dgx-a100"], CoeSetting(experts=100), MODELS)
    h100 = predict_coe(PRED["dgx-h100"], CoeSetting(experts=100), MODELS)
    assert sn.total_s and a100.total_s and h100.total_s
    assert a100.total_s / sn.total_s == pytest.approx(6.6, rel=0.10)
    assert h100.total_s / sn.total_s == pytest.approx(3.7, rel=0.10)


def test_switching_ratios_follow_the_host_links() -> None:
    expert = model("llama2-7b").weight_bytes
    sn = switch_time_s(platform("sn40l-node"), expert, 8)
    # The node-level cap of 1 TB/s binds (8 x 200 GB/s of DDR would be faster).
    assert sn == pytest.approx(expert / 1e12)
    assert switch_time_s(platform("dgx-a100"), expert, 8) / sn == pytest.approx(31, rel=0.15)
    assert switch_time_s(platform("dgx-h100"), expert, 8) / sn == pytest.approx(15, rel=0.15)


def test_150_experts_fit_the_sn40l_node_not_the_dgx() -> None:
    sn = predict_coe(PRED["sn40l-node"], CoeSetting(experts=150), MODELS)
    assert not sn.oom and sn.total_s is not None
    for dgx in ("dgx-a100", "dgx-h100"):
        r = predict_coe(PRED[dgx], CoeSetting(experts=150), MODELS)
        assert r.oom and r.total_s is None and r.switch_s is None
        assert r.oom_reason is not None and "host DRAM" in r.oom_reason
    # The limits, with their arithmetic: 8 x 1.5 TB / 13.48 GB and (2 TB - 64 GB) / 13.48 GB.
    assert expert_capacity(platform("sn40l-node"), model("llama2-7b"), 8) == 890
    assert expert_capacity(platform("dgx-a100"), model("llama2-7b"), 8) == 143


def test_coe_batch_accounting() -> None:
    r = predict_coe(PRED["sn40l-node"], CoeSetting(experts=10, batch=4), MODELS)
    assert r.switch_s == pytest.approx(4 * (r.switch_s_per_expert or 0))
    assert r.total_s == pytest.approx((r.router_s or 0) + (r.switch_s or 0) + (r.expert_s or 0))
    assert r.request_s == sorted(r.request_s) and r.request_s[-1] == pytest.approx(r.total_s)
    longer = predict_coe(
        PRED["sn40l-node"], CoeSetting(experts=10, batch=4, output_tokens=200), MODELS
    )
    assert (longer.expert_s or 0) > (r.expert_s or 0)


def test_kernel_looping_speeds_up_coe_decode() -> None:
    ho = predict_coe(
        PRED["sn40l-node"], CoeSetting(experts=10, decode_plan=FusionPlan.FUSED_HO), MODELS
    )
    kl = predict_coe(PRED["sn40l-node"], CoeSetting(experts=10), MODELS)  # the default
    assert ho.decode_plan == "fused-ho" and kl.decode_plan == "kernel-looped"
    assert (kl.expert_s or 0) < (ho.expert_s or 0)


def test_coe_refuses_bad_settings() -> None:
    with pytest.raises(InvalidRequest, match="batch"):
        CoeSetting(batch=0)
    with pytest.raises(InvalidRequest, match="one node"):
        predict_coe(PRED["sn40l-rack16"], CoeSetting(sockets=16), MODELS)


def test_footprint_19x() -> None:
    expert = model("llama2-7b")
    sn = predict_footprint(platform("sn40l-node"), expert)
    assert sn.serving_tier == "ddr" and sn.max_experts == 890
    dgx = predict_footprint(platform("dgx-h100"), expert, sn.max_experts)
    assert dgx.serving_tier == "hbm" and dgx.max_experts == 47
    assert dgx.nodes_needed == 19
    with pytest.raises(InvalidRequest):
        predict_footprint(platform("dgx-h100"), expert, 0)


@pytest.mark.parametrize(
    ("name", "seq"),
    [("llama2-7b", 4096), ("mistral-7b", 4096), ("llama2-70b", 4096), ("falcon-40b", 2048)],
)
def test_fusion_speedups_inside_published_ranges(name: str, seq: int) -> None:
    p = PRED["sn40l-node"]
    decode = predict_fusion(p, model(name), Phase.DECODE, seq, 8)
    prefill = predict_fusion(p, model(name), Phase.PREFILL, seq, 8)
    assert 1.0 <= decode.speedup <= 13.0
    assert 1.5 <= prefill.speedup <= 3.0
    assert decode.fused_kernel_calls < decode.unfused_kernel_calls
    assert 0 < decode.hbm_bandwidth_utilization <= 1


def test_training_fusion_inside_published_range() -> None:
    r = predict_fusion(PRED["sn40l-node"], model("llama2-7b"), Phase.TRAIN, 4096, 8)
    assert 1.5 <= r.speedup <= 3.0
    assert r.kernel_looped_s is None  # kernel looping is a decode technique


def test_fusion_needs_a_dataflow_platform() -> None:
    with pytest.raises(InvalidRequest, match="no dataflow fusion"):
        predict_fusion(PRED["dgx-h100"], model("llama2-7b"), Phase.DECODE, 4096, 8)


def test_models_that_do_not_fit_hbm_are_refused() -> None:
    with pytest.raises(OutOfMemory) as err:
        predict_decode(PRED["sn40l-node"], model("llama3.1-405b"), 1, 8)
    assert err.value.tier == "hbm"
    assert err.value.asked_bytes > err.value.free_bytes == 64_000_000_000
    # Sixteen sockets hold it.
    assert predict_decode(PRED["sn40l-rack16"], model("llama3.1-405b"), 1, 16).step_s > 0


def test_decode_defaults_per_platform() -> None:
    sn = predict_decode(PRED["sn40l-node"], model("llama3.1-8b"), 1)
    gpu = predict_decode(PRED["dgx-h100"], model("llama3.1-8b"), 1)
    assert sn.plan == "kernel-looped" and sn.sockets == 8
    assert gpu.plan == "unfused"
    assert sn.tokens_per_s_per_user > gpu.tokens_per_s_per_user
    batch = predict_decode(PRED["sn40l-node"], model("llama3.1-8b"), 8)
    assert batch.tokens_per_s == pytest.approx(8 * batch.tokens_per_s_per_user)
