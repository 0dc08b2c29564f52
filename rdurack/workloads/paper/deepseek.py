"""The article's headline figure for the rack: DeepSeek-R1 671B on 16 SN40L sockets at
198 output tokens/s per user (DAC 2025 talk abstract; the article seed).

Nothing was fitted to it: it is predicted from the calibrated parameter set, with the
model's published shape and FP8 weights (rack/models.py), its experts expert-parallel
(the default mapping: DeepSeek-V3 decodes expert-parallel) and kernel-looped decode.
Batch 1 (SambaNova's deployment offers batch 1 to 8; a user's own speed is batch 1's).
The context is a 1,024-token prompt, Artificial Analysis's standard workload of the
time; the latent cache is small, so the context moves the figure by under 1%.
"""

from __future__ import annotations

from rdurack.rack.models import ModelSpec
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.predictor import Predictor, predict_decode

SOURCE = "DAC 2025 talk abstract (article seed): 16 SN40L sockets"
PUBLISHED = 198.0  # output tokens/s per user
CONTEXT = 1024
SOCKETS = 16


def deepseek_r1(rack: Predictor, models: dict[str, ModelSpec]) -> list[Figure]:
    rate = predict_decode(rack, models["deepseek-r1"], 1, SOCKETS, CONTEXT)
    return [
        Figure(
            "deepseek_r1_tokens_per_s",
            "DeepSeek-R1 671B decode, tokens/s per user (FP8, batch 1)",
            SOURCE,
            "tokens/s",
            PUBLISHED,
            rate.tokens_per_s_per_user,
        )
    ]
