"""The commands that need no rack: `rdu predict` (the timing model, in one process),
`rdu spec` (every hardware number of a platform, with its source) and `rdu bench paper`
(each published figure beside the predicted one)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rdurack.cli.options import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    BatchSizeOpt,
    ExpertMappingOpt,
    JsonOpt,
    MarkdownOpt,
    ModelOpt,
    OutputTokensOpt,
    PromptTokensOpt,
    SeqOpt,
    ServePlanOpt,
    SpecOpt,
    WeightFormatOpt,
)
from rdurack.cli.stream import StreamOptions, serve_stream
from rdurack.cli.views import emit, study_table
from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ExpertMapping, ModelSpec, WeightFormat, builtin_models
from rdurack.rack.placement import capacity
from rdurack.rack.presets import with_racks
from rdurack.rack.spec import MAX_RACKS
from rdurack.rack.whatif import load_platform
from rdurack.workloads.predictor import (
    CoeSetting,
    Predictor,
    predict_coe,
    predict_decode,
    predict_footprint,
    predict_fusion,
    table_v_prompt_tokens,
)
from rdurack.workloads.serving.batch import ServeRequest
from rdurack.workloads.serving.predict import predict_serve, predict_speculative_decode
from rdurack.workloads.serving.speculative import SpeculativeSetting
from rdurack.workloads.serving.stream.bundle import BUNDLE_NAME
from rdurack.workloads.serving.stream.replay import StreamSetting
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.scaling import (
    ScalingPoint,
    check_fits,
    predict_scaling,
    step_cost,
)


def _model(name: str) -> ModelSpec:
    models = builtin_models()
    if name not in models:
        raise UnknownName("model", name, sorted(models))
    return models[name]


def _models(
    name: str, mapping: ExpertMapping | None, weights: WeightFormat | None = None
) -> dict[str, ModelSpec]:
    """The presets, with model `name`'s experts placed as `mapping` says (None: the
    default, rack/layers.py `expert_mapping`) and its weights stored as `weights` says
    (None: as published)."""
    models = builtin_models()
    chosen = _model(name).placed(mapping)
    if weights is not None:
        chosen = chosen.model_copy(update={"weight_format": weights})
    models[name] = chosen
    return models


# --------------------------------------------------------------------- predict


def predict_fusion_cmd(
    model: ModelOpt,
    phase: Annotated[Phase, typer.Option(help="one prefill pass, one decoded token, one step")],
    seq: SeqOpt = 4096,
    sockets: Annotated[int, typer.Option(min=1, help="SN40L sockets (tensor parallel)")] = 8,
    batch_size: BatchSizeOpt = 1,
    platform: Annotated[str, typer.Option(help="an SN40L platform")] = "sn40l-rack16",
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Unfused vs fused (SO and HO launch) time of one step on N SN40L sockets."""
    p = Predictor(load_platform(platform, spec))
    r = predict_fusion(p, _model(model), phase, seq, sockets, batch_size)
    emit(as_json, r.to_dict(), f"fusion: {model} {phase.value} on {sockets} sockets")


PlatformOpt = Annotated[str, typer.Option(help="sn40l-node, sn40l-rack16, dgx-a100, dgx-h100")]
SocketsOpt = Annotated[
    int | None, typer.Option(min=1, help="default: all of the platform (N GPUs for a DGX)")
]


def predict_decode_cmd(
    platform: PlatformOpt,
    model: Annotated[str, typer.Option(help="model preset")],
    batch_size: BatchSizeOpt = 1,
    sockets: SocketsOpt = None,
    context: Annotated[int, typer.Option(min=1, help="tokens each sequence attends to")] = 4096,
    plan: Annotated[
        FusionPlan | None, typer.Option(help="default: kernel-looped on SN40L, unfused on GPUs")
    ] = None,
    speculative: SpeculativeSetting | None = None,
    expert_mapping: ExpertMappingOpt = None,
    weight_format: WeightFormatOpt = None,
    batch_sizes: Annotated[
        str | None,
        typer.Option(
            help="a study instead of one answer: comma-separated batch sizes, a row each, "
            "and how many sequences fit"
        ),
    ] = None,
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """Steady-state decode throughput of a model on a platform, and where its weights
    and KV cache live on each socket. With --speculative, step_s is a draft-and-verify
    iteration's time over the tokens it yields."""
    p = Predictor(load_platform(platform, spec))
    models = _models(model, expert_mapping, weight_format)
    if batch_sizes is not None:
        if speculative is not None:
            raise InvalidRequest("--batch-sizes studies plain decoding: drop --speculative")
        sizes = _sizes(batch_sizes)
        _decode_study(p, models[model], sizes, sockets, context, plan, as_json, markdown)
        return
    if speculative is None:
        r = predict_decode(p, models[model], batch_size, sockets, context, plan)
    else:
        request = ServeRequest(model, batch_size, context, 1, sockets, plan, speculative)
        r = predict_speculative_decode(p, request, context, models)
    emit(as_json, r.to_dict(), f"decode: {model} on {platform}")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise InvalidRequest(f"--batch-sizes: positive integers separated by commas, got {text!r}")
    return sizes


STUDY = (  # column, DecodeResult field (placement's nested), format
    ("batch", "batch", "{:d}"),
    ("tokens/s per user", "tokens_per_s_per_user", "{:.1f}"),
    ("tokens/s", "tokens_per_s", "{:.0f}"),
    ("HBM bandwidth used", "hbm_bandwidth_utilization", "{:.0%}"),
    ("experts in DDR", "placement.cold_experts", "{:.0%}"),
    ("KV cache per socket (GB)", "placement.kv_hbm_bytes", "{:.1f}"),
)


def _decode_study(
    p: Predictor,
    model: ModelSpec,
    sizes: list[int],
    sockets: int | None,
    context: int,
    plan: FusionPlan | None,
    as_json: bool,
    markdown: bool,
) -> None:
    """Decode at each batch size, and the group's capacity at this context."""
    n = p.platform.sockets if sockets is None else sockets
    rows = [predict_decode(p, model, b, n, context, plan).to_dict() for b in sizes]
    cap = capacity(model, p.platform, n, context)
    if as_json:
        print(json.dumps({"rows": rows, "capacity": asdict(cap)}))
        return

    def cell(row: dict[str, Any], key: str, form: str) -> str:
        value = row["placement"][key[10:]] if key.startswith("placement.") else row[key]
        return form.format(value / 1e9 if key.endswith("_bytes") else value)

    cells = [[cell(r, key, form) for _, key, form in STUDY] for r in rows]
    caption = (
        f"{model.name} on {n} {p.platform.name} sockets at {context} tokens of context: "
        f"{cap.max_batch_experts_in_hbm} sequences with every expert in HBM, "
        f"{cap.max_batch} at most"
    )
    study_table([c for c, _, _ in STUDY], cells, caption, markdown)


def predict_serve_cmd(
    platform: PlatformOpt,
    model: Annotated[str, typer.Option(help="model preset")],
    sockets: SocketsOpt = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="default: 1")] = None,
    prompt_tokens: PromptTokensOpt = DEFAULT_PROMPT_TOKENS,
    output_tokens: OutputTokensOpt = DEFAULT_OUTPUT_TOKENS,
    plan: ServePlanOpt = None,
    speculative: SpeculativeSetting | None = None,
    stream: StreamOptions | None = None,
    expert_mapping: ExpertMappingOpt = None,
    weight_format: WeightFormatOpt = None,
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """A batch of requests end to end: time to first token (the prefill), mean
    inter-token latency, end-to-end latency, tokens/s, and where the time went. The KV
    cache grows with every decoded token; a batch that does not fit HBM is refused.

    tokens_per_s_per_user is 1 / itl_s, the decode speed a user sees after the first
    token (as PAPER Table IV and Artificial Analysis measure it); tokens_per_s is every
    generated token over e2e_s.

    With --arrivals or --trace: a stream of requests served under a batching --policy,
    with the percentiles of TTFT, inter-token latency and end-to-end latency,
    throughput, and goodput under the SLOs given; with several rates, a study of them
    (docs/serving.md)."""
    models = _models(model, expert_mapping, weight_format)
    predictor = Predictor(load_platform(platform, spec))
    if stream is not None:
        if batch_size is not None or speculative is not None:
            raise InvalidRequest(
                "a stream is batched by its --policy up to --max-batch, without "
                "speculation: drop --batch-size and --speculative"
            )
        bundle = stream.bundle(model)
        setting = StreamSetting(
            BUNDLE_NAME if bundle else model, sockets, stream.policy, stream.max_batch,
            stream.chunk_tokens, plan, expert_mapping, stream.slo_ttft_s, stream.slo_itl_s,
            bundle,
        )  # fmt: skip
        lengths = (prompt_tokens, output_tokens)
        serve_stream(predictor, setting, stream, lengths, models, as_json, markdown)
        return
    if markdown:
        raise InvalidRequest("--markdown prints a stream's study: it needs --arrivals")
    request = ServeRequest(
        model, batch_size or 1, prompt_tokens, output_tokens, sockets, plan, speculative
    )
    r = predict_serve(predictor, request, models)
    emit(as_json, r.model_dump(mode="json"), f"serve: {model} on {platform}")


def predict_coe_cmd(
    platform: Annotated[str, typer.Option(help="sn40l-node, dgx-a100 or dgx-h100")],
    experts: Annotated[int, typer.Option(min=1, help="experts in the catalog")] = 150,
    batch_size: BatchSizeOpt = 8,
    output_tokens: Annotated[int, typer.Option(min=1)] = 20,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="default: PAPER Table V's prompt, a fitted assumption"),
    ] = None,
    expert_model: Annotated[str, typer.Option()] = "llama2-7b",
    router_model: Annotated[str, typer.Option()] = "llama2-7b",
    decode_plan: Annotated[
        FusionPlan | None,
        typer.Option(help="default: kernel-looped on SN40L (as Table V), unfused on GPUs"),
    ] = None,
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A batch of Composition-of-Experts requests: router, switching, experts."""
    models = {m: _model(m) for m in (expert_model, router_model)}
    setting = CoeSetting(
        experts=experts,
        batch=batch_size,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens or table_v_prompt_tokens(),
        expert_model=expert_model,
        router_model=router_model,
        decode_plan=decode_plan,
    )
    r = predict_coe(Predictor(load_platform(platform, spec)), setting, models)
    data = r.to_dict()
    data.pop("request_s")
    data["request_s"] = r.request_s  # last: the table shows the scalars first
    emit(as_json, data, f"CoE on {platform}")


def predict_ddp_cmd(
    model: Annotated[str, typer.Option(help="a model preset, or mlp / transformer")],
    batch_per_rank: Annotated[int, typer.Option(min=1, help="samples per rank per step")] = 1,
    sequence_length: Annotated[int, typer.Option(min=1, help="tokens per sample")] = 1024,
    optimizer: Annotated[str, typer.Option(help="sgd or adam")] = "sgd",
    platform: Annotated[str, typer.Option()] = "sn40l-rack16",
    racks: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_RACKS,
            help="scale the platform to this many racks, joined by its spine (default: "
            "rdu spec's assumptions)",
        ),
    ] = None,
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """DDP scaling at a fixed batch per rank: step time, all-reduce time and the part
    backward does not hide, samples/s and scaling efficiency, for 1, 2, 4, ... ranks up
    to every socket (16 crosses nodes; more racks cross the spine)."""
    w = TrainingWorkload.model_validate(
        {
            "model": model,
            "world_size": 1,
            "global_batch": batch_per_rank,
            "sequence_length": sequence_length,
            "optimizer": optimizer,
        }
    )
    p = load_platform(platform, spec)
    if racks is not None:
        p = with_racks(p, racks)
    cost = step_cost(w, p, builtin_models())
    # A rank that does not fit is reported, not refused: the timing is still the question
    # (the rack would refuse the job; the table says so).
    try:
        check_fits(w, p, cost)
        refused = ""
    except OutOfMemory as e:
        refused = str(e)
    points = predict_scaling(w, p, builtin_models())
    if as_json:
        print(json.dumps({"model": model, "platform": p.name, "racks": p.racks,
                          "memory": cost.memory.to_dict(), "fits": not refused,
                          "refused": refused,
                          "scaling": [asdict(x) for x in points]}))  # fmt: skip
        return
    header, cells = ddp_rows(points, p.racks > 1)
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for row in cells:
            print("| " + " | ".join(row) + " |")
        if refused:
            print(f"\nTiming only: the rack would refuse it: {refused}.")
        return
    racked = f", {p.racks} racks" if p.racks > 1 else ""
    table = Table(title=f"DDP {model} on {p.name}{racked}, {batch_per_rank} per rank")
    for col in header:
        table.add_column(col, justify="right")
    for row in cells:
        table.add_row(*row)
    Console().print(table)
    if refused:
        Console(stderr=True).print(f"[yellow]timing only: the rack would refuse it: {refused}")


def ddp_rows(points: list[ScalingPoint], racks: bool) -> tuple[list[str], list[list[str]]]:
    """The scaling table's header and rows as printed (the docs' figure reads them back);
    `racks`: a column of racks."""
    header = ["ranks", "step", "compute", "all-reduce", "exposed", "samples/s", "efficiency"]
    header += ["nodes", *(["racks"] if racks else [])]
    rows = [
        [
            str(x.world_size),
            f"{x.step_s * 1e3:.3f} ms",
            f"{x.compute_s * 1e3:.3f} ms",
            f"{x.all_reduce_s * 1e3:.3f} ms",
            f"{x.exposed_s * 1e3:.3f} ms",
            f"{x.samples_per_s:,.1f}",
            f"{x.efficiency:.1%}",
            str(x.nodes),
            *([str(x.racks)] if racks else []),
        ]
        for x in points
    ]
    return header, rows


def predict_footprint_cmd(
    platform: Annotated[str, typer.Option()],
    expert_model: Annotated[str, typer.Option()] = "llama2-7b",
    experts: Annotated[int | None, typer.Option(min=1, help="how many nodes for N experts")] = None,
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """How many experts a node holds where it serves them from; nodes for N."""
    r = predict_footprint(load_platform(platform, spec), _model(expert_model), experts)
    emit(as_json, r.to_dict(), f"footprint on {platform}")


def spec_cmd(
    platform: Annotated[str, typer.Option(help="sn40l-node, sn40l-rack16, dgx-a100, dgx-h100")],
    spec: SpecOpt = None,
    as_json: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """Every hardware number of a platform, with its source."""
    p = load_platform(platform, spec)
    rows = p.numbers()
    if as_json:
        print(
            json.dumps(
                {
                    "platform": p.name,
                    "numbers": [{"field": f, "value": v, "source": src} for f, v, src in rows],
                }
            )
        )
        return
    if markdown:
        print("| field | value | source |\n|---|---|---|")
        for f, v, src in rows:
            print(f"| `{f}` | {v:.4g} | {src} |")
        return
    table = Table(title=f"{p.name}: {p.description}")
    for col in ("field", "value", "source"):
        table.add_column(col)
    for f, v, src in rows:
        table.add_row(f, f"{v:.4g}", src)
    Console().print(table)
