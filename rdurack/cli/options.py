"""The options `rdu` commands share, and two groups of options as one dependency each:
the connection options, and speculative decoding's.

A command that calls the orchestrator takes a keyword parameter `to: Target`;
`talks_to_orchestrator` shows typer, in its place, the options of `connection`
(--address, --token, --token-file, --tls-ca, --tls-server-name), so every such command
has the same five with the same help, and calls the command with the Target they make.
It also turns the command's gRPC failures into one line naming the orchestrator.
Likewise a command that may decode speculatively takes a `SpeculativeSetting | None`
parameter; `speculates` shows typer, in its place, the options of `speculation`
(--speculative, --draft-model, --draft-tokens, --acceptance, with the defaults of
workloads/serving/speculative.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import typer

from rdurack.client.connection import DEFAULT_ADDRESS, Target, one_line_errors
from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.models import ExpertMapping, WeightFormat
from rdurack.security.tls import ENV_CA, ENV_SERVER_NAME
from rdurack.workloads.serving.speculative import (
    DRAFT_MODELS,
    SpeculativeSetting,
)

WATCH_TIMEOUT_S = 600.0  # how long --wait and rdu watch follow a job by default, wall s

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", help="print a Markdown table")]
SpecOpt = Annotated[
    Path | None,
    typer.Option("--spec", help="what-if YAML overriding hardware numbers of the platform"),
]
StateDirOpt = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="RDURACK_STATE_DIR",
        help="where rdu up records its processes, logs and the job store",
    ),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1, help="seconds to wait for the job to end")
]
WaitOpt = Annotated[bool, typer.Option("--wait", help="follow the job until it ends")]
NameOpt = Annotated[str, typer.Option(help="a label for the job")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="orchestrator port")]
ModelOpt = Annotated[str, typer.Option(help="model preset, e.g. llama2-7b")]
SeqOpt = Annotated[int, typer.Option(min=1, help="prompt length, or the decode context")]
BatchSizeOpt = Annotated[int, typer.Option(min=1)]
PromptTokensOpt = Annotated[int, typer.Option(min=1, help="prompt length of each request")]
OutputTokensOpt = Annotated[int, typer.Option(min=1, help="tokens each request generates")]
# A batch served (rdu predict serve, rdu submit kernel --phase serve) by default.
DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 1024
ServePlanOpt = Annotated[
    FusionPlan | None,
    typer.Option(
        "--plan",
        "--fusion-plan",
        help="decode plan; default: kernel-looped on SN40L, unfused on GPUs (prefill: "
        "fused-ho for kernel-looped, else the same plan)",
    ),
]

# Speculative decoding (workloads/serving/speculative.py holds the defaults and their reasons).
SpeculativeOpt = Annotated[
    bool,
    typer.Option(
        "--speculative", help="speculative decoding: a draft model proposes, the target verifies"
    ),
]
_DRAFTS = ", ".join(f"{d} for {t}" for t, d in DRAFT_MODELS.items())
DraftModelOpt = Annotated[
    str | None,
    typer.Option(help=f"with --speculative; default: the target's draft ({_DRAFTS})"),
]
DraftTokensOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=64,
        help="with --speculative: tokens drafted per iteration (default: the calibrated k, "
        "rdu bench assumptions)",
    ),
]
AcceptanceOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        max=1.0,
        help="with --speculative: chance a drafted token is accepted (default: the calibrated one)",
    ),
]

AddressOpt = Annotated[
    str,
    typer.Option("--address", envvar="RDURACK_ORCHESTRATOR", help="the orchestrator's host:port"),
]
TokenOpt = Annotated[
    str,
    typer.Option(
        "--token", envvar="RDURACK_TOKEN", help="bearer token (the rack's tokens file names it)"
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option("--token-file", envvar="RDURACK_TOKEN_FILE", help="a file holding the token"),
]
TlsCaOpt = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca", envvar=ENV_CA, help="TLS: the CA of the orchestrator's certificate (PEM)"
    ),
]
TlsNameOpt = Annotated[
    str,
    typer.Option(
        "--tls-server-name",
        envvar=ENV_SERVER_NAME,
        help="TLS: the name to expect in its certificate (default: the host dialled)",
    ),
]


def connection(
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
) -> Target:
    """The orchestrator a client command talks to, from its connection options."""
    return Target.from_options(address, token, token_file, tls_ca, tls_server_name)


def talks_to_orchestrator(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with its `to: Target` parameter shown to typer as the options of
    `connection`, in its place; its gRPC failures one line (the module docstring)."""
    return in_place_of(command, Target, connection, lambda to: one_line_errors(to.address))


def speculation(
    speculative: SpeculativeOpt = False,
    draft_model: DraftModelOpt = None,
    draft_tokens: DraftTokensOpt = None,
    acceptance: AcceptanceOpt = None,
) -> SpeculativeSetting | None:
    """The speculative options as a setting; None without --speculative (where a draft
    model named anyway is refused: it would be ignored)."""
    if not speculative:
        if draft_model is not None:
            raise InvalidRequest("--draft-model needs --speculative")
        return None
    return SpeculativeSetting.of(draft_model, draft_tokens, acceptance)


def speculates(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with its `SpeculativeSetting | None` parameter shown to typer as the
    options of `speculation`, in its place."""
    return in_place_of(command, SpeculativeSetting | None, speculation)


def in_place_of(
    command: Callable[..., None],
    annotation: object,
    factory: Callable[..., Any],
    guard: Callable[[Any], AbstractContextManager[None]] | None = None,
) -> Callable[..., None]:
    """`command` with its one parameter annotated `annotation` shown to typer as the
    parameters of `factory`, in its place: it is called with what `factory` makes of
    them (inside `guard(made)`, when given)."""
    signature = inspect.signature(command, eval_str=True)
    options = list(inspect.signature(factory, eval_str=True).parameters.values())
    (target,) = [p for p in signature.parameters.values() if p.annotation == annotation]
    shown = []
    for p in signature.parameters.values():
        shown += [o.replace(kind=target.kind) for o in options] if p is target else [p]

    @functools.wraps(command)
    def run(**kwargs: Any) -> None:
        made = factory(**{o.name: kwargs.pop(o.name) for o in options})
        with guard(made) if guard else contextlib.nullcontext():
            command(**kwargs, **{target.name: made})

    # typer reads a command's options from its signature and type hints.
    run.__signature__ = signature.replace(parameters=shown)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in shown} | {"return": None}
    return run


ExpertMappingOpt = Annotated[
    ExpertMapping | None,
    typer.Option(
        help="an MoE model's experts: whole on each socket (expert-parallel) or split over "
        "every socket (tensor-parallel); default: expert-parallel where they divide evenly"
    ),
]
WeightFormatOpt = Annotated[
    WeightFormat | None,
    typer.Option(
        help="how the layers' matrices are stored: native (BF16) or fp8-block128 (FP8 with "
        "block scales); default: as the model publishes them"
    ),
]
