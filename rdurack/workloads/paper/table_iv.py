"""PAPER Table IV: Llama 3.1 on the 16-socket SN40L rack, BF16 weights, 8K sequence
length, output tokens per second per user (the decode speed after the first token, as
SambaNova's blog and Artificial Analysis measured it). The 70B and 405B rows used
speculative decoding, its draft, draft length and acceptance unpublished: the draft is
the family's 8B (serving/speculative.py), k and a are fitted assumptions.
"""

from __future__ import annotations

from rdurack.rack.kernels import FusionPlan
from rdurack.rack.models import ModelSpec
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.predictor import DecodeResult, Predictor, predict_decode
from rdurack.workloads.serving.batch import ServeRequest
from rdurack.workloads.serving.predict import predict_speculative_decode
from rdurack.workloads.serving.speculative import SpeculativeSetting

SOURCE = "PAPER Table IV (16 SN40L sockets, 8K sequence)"
CONTEXT = 8192  # "8K sequence length": the context a decoded token attends to
SOCKETS = 16
# (model, published tokens/s per user, speculative), PAPER Table IV.
ROWS = (
    ("llama3.1-8b", 1042.0, False),
    ("llama3.1-70b", 457.0, True),
    ("llama3.1-405b", 129.0, True),
)


def table_iv(
    rack: Predictor, models: dict[str, ModelSpec], spec: SpeculativeSetting
) -> list[Figure]:
    """Each row's decode speed per user at batch 1, kernel-looped (SN40L's default)."""
    out = []
    for name, published, speculative in ROWS:
        rate: DecodeResult
        if speculative:
            request = ServeRequest(
                name, 1, CONTEXT - 1, 1, SOCKETS, FusionPlan.KERNEL_LOOPED, speculative=spec
            )
            rate = predict_speculative_decode(rack, request, CONTEXT, models)
        else:
            rate = predict_decode(rack, models[name], 1, SOCKETS, CONTEXT)
        size = name.removeprefix("llama3.1-").upper()
        how = ", speculative" if speculative else ""
        out.append(
            Figure(
                f"table_iv_{name.replace('.', '_').replace('-', '_')}",
                f"Llama 3.1 {size} decode, tokens/s per user{how}",
                SOURCE,
                "tokens/s",
                published,
                rate.tokens_per_s_per_user,
                fitted=True,
            )
        )
    return out
