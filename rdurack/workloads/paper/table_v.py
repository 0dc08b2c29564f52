"""PAPER Table V in full: the SN40L node against DGX A100 and H100 nodes serving a
Composition of Experts (router and experts TP8 on every platform), and the 150-expert
capacity figures of Sec. VI-C.

Each speedup is the DGX's time over the SN40L node's for the same batch: `overall` is
the router pass, every request's expert switch (DDR or host DRAM to HBM) and its expert
run (prefill, then decode); `expert-only` is the expert runs alone, the experts already
in HBM (PAPER: "no switching"), at batch 1. Model switching compares one expert's
switch.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdurack.rack.kernels import FusionPlan
from rdurack.rack.models import ModelSpec
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.predictor import CoeResult, CoeSetting, Predictor, predict_coe

# PAPER Table V compares at an expert count the DGX can hold (at 150 it runs out of
# memory); with every prompt switching a cold expert, the time does not depend on it.
TABLE_V_EXPERTS = 100
# Which SN40L software PAPER's Table V measured is not stated. Kernel looping (KL, arXiv
# 2410.23668) was published five months after PAPER, but by the same team about the
# same hardware; the joint fit reproduces Table V, KL's gain and PAPER Table IV with the
# kernel-looped decode and cannot with per-layer fused decode (docs/figures.md gives
# both fits' errors), so Table V is reproduced kernel-looped, as SN40L decodes today.
TABLE_V_DECODE_PLAN = FusionPlan.KERNEL_LOOPED
SOURCE = "PAPER Table V"
DGX = {"dgx-a100": "DGX A100", "dgx-h100": "DGX H100"}
# (batch, output tokens, expert-only, A100 published, H100 published), PAPER Table V.
ROWS = (
    (8, 20, False, 6.6, 3.7),
    (1, 20, False, 4.8, 2.8),
    (1, 20, True, 2.0, 1.5),
    (8, 200, False, 4.2, 2.7),
    (1, 200, False, 3.9, 2.6),
    (1, 200, True, 3.2, 2.3),
)
SWITCHING = {"dgx-a100": 31.0, "dgx-h100": 15.0}  # the text says 16x for H100


@dataclass(frozen=True)
class TableV:
    """Predicts PAPER Table V's rows with the given predictors and Table V's prompt;
    `decode_plan`: the SN40L's decode (another plan than TABLE_V_DECODE_PLAN is a what-if,
    `rdu calibrate --table-v-decode-plan`)."""

    predictors: dict[str, Predictor]
    models: dict[str, ModelSpec]
    prompt_tokens: float  # an integer, but for the fit's trial values
    decode_plan: FusionPlan = TABLE_V_DECODE_PLAN

    def coe(self, platform: str, experts: int, batch: int = 8, output: int = 20) -> CoeResult:
        p = self.predictors[platform]
        plan = self.decode_plan if p.platform.socket.kernels.dataflow_fusion else None
        setting = CoeSetting(
            experts=experts,
            batch=batch,
            output_tokens=output,
            prompt_tokens=self.prompt_tokens,  # type: ignore[arg-type]
            decode_plan=plan,
        )
        return predict_coe(p, setting, self.models)

    def figures(self) -> list[Figure]:
        return [*self._speedups(), *self._switching(), *self._capacity()]

    def _speedups(self) -> list[Figure]:
        out = []
        for batch, tokens, expert_only, *published in ROWS:
            sn = self.coe("sn40l-node", TABLE_V_EXPERTS, batch, tokens)
            what = "expert-only speedup (experts in HBM)" if expert_only else "overall speedup"
            for (name, label), pub in zip(DGX.items(), published, strict=True):
                dgx = self.coe(name, TABLE_V_EXPERTS, batch, tokens)
                ratio = _ratio(dgx, sn, expert_only)
                key = f"coe_{'expert' if expert_only else 'overall'}_b{batch}_t{tokens}_{name}"
                out.append(
                    Figure(
                        key,
                        f"CoE {what}, SN40L node vs {label}, batch {batch}, {tokens} tokens",
                        SOURCE,
                        "x",
                        pub,
                        ratio,
                        fitted=True,
                    )
                )
        return out

    def _switching(self) -> list[Figure]:
        sn = self.coe("sn40l-node", TABLE_V_EXPERTS)
        assert sn.switch_s_per_expert is not None
        out = []
        for name, published in SWITCHING.items():
            dgx = self.coe(name, TABLE_V_EXPERTS)
            assert dgx.switch_s_per_expert is not None
            out.append(
                Figure(
                    f"switch_speedup_{name.replace('-', '_')}",
                    f"model switching, SN40L node vs {DGX[name]}",
                    f"{SOURCE}; Sec. VI-C",
                    "x",
                    published,
                    dgx.switch_s_per_expert / sn.switch_s_per_expert,
                )
            )
        return out

    def _capacity(self) -> list[Figure]:
        src = f"{SOURCE}; Sec. VI-C"
        return [
            *(
                Figure(
                    f"coe_150_{name.replace('-', '_')}_oom",
                    f"150 experts: {DGX[name]} runs out of memory",
                    src,
                    "",
                    True,
                    self.coe(name, 150).oom,
                )
                for name in DGX
            ),
            Figure(
                "coe_150_sn40l_serves",
                "150 experts: the SN40L node serves them",
                src,
                "",
                True,
                not self.coe("sn40l-node", 150).oom,
            ),
        ]


def _ratio(dgx: CoeResult, sn: CoeResult, expert_only: bool) -> float:
    a, b = (dgx.expert_s, sn.expert_s) if expert_only else (dgx.total_s, sn.total_s)
    assert a is not None and b is not None, "Table V's setting fits every platform"
    return a / b
