"""`rdu`: the command line of rdurack. `build_app` puts its commands together; `main`
runs it.

Errors are one line on stderr and exit code 2: a bad value names itself and the
accepted ones. `--json` prints one JSON object (a list for `bench paper`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

import typer

from rdurack.cli import (
    coe,
    demo,
    fault,
    jobs,
    paper,
    predict,
    rack,
    security,
    serve,
    trace,
    train,
)
from rdurack.cli.options import speculates, talks_to_orchestrator
from rdurack.cli.stream import streams
from rdurack.errors import RdurackError

Commands = dict[str, Callable[..., None]]


def build_app() -> typer.Typer:
    """The `rdu` application: every command and group, in the order `rdu --help` lists
    them. Commands that call the orchestrator get its connection options here, and those
    that may decode speculatively the speculative options."""
    app = typer.Typer(
        help="rdurack: an emulated rack of SN40L-style RDU sockets.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    _add(
        app,
        {
            "up": rack.up_cmd,
            "down": rack.down_cmd,
            "join": rack.join_cmd,
            "watch": talks_to_orchestrator(jobs.watch_cmd),
            "job": talks_to_orchestrator(jobs.job_cmd),
            "cancel": talks_to_orchestrator(jobs.cancel_cmd),
            "logs": talks_to_orchestrator(train.logs_cmd),
            "jobs": talks_to_orchestrator(jobs.jobs_cmd),
            "status": talks_to_orchestrator(rack.status_cmd),
            "demo": demo.demo_cmd,
            "serve": talks_to_orchestrator(serve.serve_cmd),
            "certs": security.certs_cmd,
            "token": security.token_cmd,
            "trace": trace.trace_cmd,
            "plot": trace.plot_cmd,
            "spec": predict.spec_cmd,
            "calibrate": paper.calibrate_cmd,
        },
    )
    submit = _group(
        "Submit a job to the rack's orchestrator.",
        {
            "kernel": talks_to_orchestrator(speculates(jobs.submit_kernel_cmd)),
            "coe": talks_to_orchestrator(coe.submit_coe_cmd),
            "train": talks_to_orchestrator(train.submit_train_cmd),
        },
    )
    faults = _group(
        "Inject faults into the rack and heal them (an admin token where tokens are on).",
        {
            "kill-socket": talks_to_orchestrator(fault.kill_socket_cmd),
            "kill-agent": talks_to_orchestrator(fault.kill_agent_cmd),
            "slow": talks_to_orchestrator(fault.slow_cmd),
            "drop-link": talks_to_orchestrator(fault.drop_link_cmd),
            "delay-link": talks_to_orchestrator(fault.delay_link_cmd),
            "partition": talks_to_orchestrator(fault.partition_cmd),
            "heal": talks_to_orchestrator(fault.heal_cmd),
            "list": talks_to_orchestrator(fault.list_cmd),
        },
    )
    predictions = _group(
        "Predict with the timing model, in one process.",
        {
            "fusion": predict.predict_fusion_cmd,
            "decode": speculates(predict.predict_decode_cmd),
            "serve": streams(speculates(predict.predict_serve_cmd)),
            "coe": predict.predict_coe_cmd,
            "ddp": predict.predict_ddp_cmd,
            "footprint": predict.predict_footprint_cmd,
        },
    )
    bench = _group(
        "Reproduce published figures.",
        {"paper": paper.bench_paper_cmd, "assumptions": paper.bench_assumptions_cmd},
    )
    for name, group in (
        ("submit", submit),
        ("fault", faults),
        ("predict", predictions),
        ("bench", bench),
    ):
        app.add_typer(group, name=name)
    return app


def _group(help_text: str, commands: Commands) -> typer.Typer:
    group = typer.Typer(help=help_text, no_args_is_help=True)
    _add(group, commands)
    return group


def _add(group: typer.Typer, commands: Commands) -> None:
    for name, command in commands.items():
        group.command(name, help=paragraphs(command.__doc__ or ""))(command)


def paragraphs(doc: str) -> str:
    """A docstring as help the terminal wraps: each paragraph on one line (typer keeps a
    docstring's line breaks, so the source's wrapping would break sentences)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


def main() -> None:
    """Entry point: one-line errors, exit code 2 for bad input, never a traceback."""
    try:
        code = build_app()(standalone_mode=False)
        if isinstance(code, int) and code:  # typer returns 130 on Ctrl-C, after cleanup
            if code == 130:
                print("rdu: interrupted", file=sys.stderr)
            sys.exit(code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as e:
        # Typer vendors click; its usage errors all derive from TyperException.
        fmt = getattr(e, "format_message", None)
        message = str(fmt() if callable(fmt) else e)
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `rdu` or `rdu predict`
            print(message)
            sys.exit(0)
        print(f"rdu: {message.splitlines()[0] if message else e}", file=sys.stderr)
        sys.exit(2)
    except RdurackError as e:
        print(f"rdu: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))


if __name__ == "__main__":
    main()
