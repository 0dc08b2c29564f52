"""The `rdu` typer application and the options its commands share.

Commands register on `app` from cli.py (the offline predictor and paper commands) and
cli_rack.py (commands for a running rack); cli.main runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="rdurack: an emulated rack of SN40L-style RDU sockets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
SpecOpt = Annotated[
    Path | None,
    typer.Option("--spec", help="what-if YAML overriding hardware numbers of the platform"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]


def emit(as_json: bool, data: dict[str, Any], title: str) -> None:
    if as_json:
        print(json.dumps(data))
        return
    table = Table(title=title, show_header=False)
    for key, value in data.items():
        if isinstance(value, list):
            value = ", ".join(fmt(v) for v in value)
        table.add_row(key, fmt(value))
    Console().print(table)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)
