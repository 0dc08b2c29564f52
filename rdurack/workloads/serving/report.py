"""What serving a batch of requests reports, and `report`, which makes it from what the
batch's prefill and decode cost: `rdu predict serve` prints it, and a serve job's result
carries it (orchestrator/results.py), made by the same function from the sockets'
clocks, so the two have the same fields and figures. Times are emulated seconds."""

from __future__ import annotations

from rdurack.config import Config
from rdurack.workloads.serving.batch import ServeBatch
from rdurack.workloads.serving.costs import Cost


class ServeBreakdown(Config):
    """Where the batch's time went, and what it moved and held."""

    prefill_s: float = 0.0  # the prefill pass (and the draft's, when speculating)
    decode_s: float = 0.0  # every decode step (or speculative iteration) after it
    launch_s: float = 0.0  # kernel launches, prefill and decode (part of the two above)
    collective_s: float = 0.0  # TP all-reduces nothing hides (part of the two above)
    decode_iterations: int = 0  # decode steps, or draft-and-verify iterations
    kernel_calls: int = 0  # per socket
    hbm_bytes_moved: int = 0  # HBM traffic per socket, prefill and decode
    kv_cache_bytes: int = 0  # the KV cache at the end, all sockets (the draft's included)
    hbm_bytes_per_socket: int = 0  # what a socket holds at the end: weights and KV share


class SpeculativeFigures(Config):
    """The speculative-decoding assumptions a result used (serving/speculative.py)."""

    draft_model: str = ""
    draft_tokens: int = 0
    acceptance: float = 0.0
    tokens_per_iteration: float = 0.0  # (1 - a^(k+1)) / (1 - a)


class ServeReport(Config):
    """A batch of `batch_size` requests of `prompt_tokens` each, generating
    `output_tokens` each, on `num_sockets` sockets (tensor parallel). Every field has a
    default (the proto's), so a stored result of an older release still reads."""

    platform: str = ""
    model: str = ""
    num_sockets: int = 0
    batch_size: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    plan: str = ""  # the decode's fusion plan
    prefill_plan: str = ""
    ttft_s: float = 0.0  # time to first token: the prefill pass, which yields it
    # Mean inter-token latency of the decode after the first token; None with one output
    # token (there is no second).
    itl_s: float | None = None
    e2e_s: float = 0.0  # prefill through the last token of the batch
    tokens_per_s: float = 0.0  # batch x output tokens / e2e_s
    # 1 / itl_s: the decode speed a user sees after the first token (PAPER Table IV's and
    # Artificial Analysis's "output tokens/s per user").
    tokens_per_s_per_user: float | None = None
    hbm_bandwidth_utilization: float = 0.0  # HBM bytes moved / (e2e_s x peak), per socket
    breakdown: ServeBreakdown = ServeBreakdown()
    speculative: SpeculativeFigures | None = None  # None: plain decoding


def report(b: ServeBatch, prefill: Cost, decode: Cost) -> ServeReport:
    """The batch's figures from what its prefill and decode cost (predicted, or measured
    on the cluster's clocks)."""
    r = b.request
    e2e = prefill.seconds + decode.seconds
    itl = decode.seconds / (r.output_tokens - 1) if r.output_tokens > 1 else None
    total = prefill + decode
    peak = b.platform.socket.hbm.bandwidth_bytes_per_s
    spec = r.speculative
    return ServeReport(
        platform=b.platform.name,
        model=b.target.name,
        num_sockets=b.sockets,
        batch_size=r.batch_size,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.output_tokens,
        plan=b.plan.value,
        prefill_plan=b.prefill_plan.value,
        ttft_s=prefill.seconds,
        itl_s=itl,
        e2e_s=e2e,
        tokens_per_s=r.batch_size * r.output_tokens / e2e,
        tokens_per_s_per_user=1.0 / itl if itl else None,
        hbm_bandwidth_utilization=total.hbm_bytes / (e2e * peak),
        breakdown=ServeBreakdown(
            prefill_s=prefill.seconds,
            decode_s=decode.seconds,
            launch_s=total.launch_s,
            collective_s=total.collective_s,
            decode_iterations=b.iterations,
            kernel_calls=round(total.kernel_calls),
            hbm_bytes_moved=round(total.hbm_bytes),
            kv_cache_bytes=b.kv_cache_bytes(),
            hbm_bytes_per_socket=b.held_per_socket(),
        ),
        speculative=None
        if spec is None or b.draft is None
        else SpeculativeFigures(
            draft_model=b.draft.name,
            draft_tokens=spec.draft_tokens,
            acceptance=spec.acceptance,
            tokens_per_iteration=spec.tokens_per_iteration,
        ),
    )
