"""The `rdu` application as `build_app` puts it together: every command in its place,
help texts the terminal wraps, nothing registered by importing a module, and the
connection options every client command shares."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

import rdurack.cli
from rdurack.cli.main import build_app, paragraphs
from rdurack.cli.options import speculates, talks_to_orchestrator
from rdurack.client.connection import RackCallFailed, Target
from rdurack.client.jobs import JobClient
from rdurack.errors import RdurackError
from rdurack.workloads.serving.speculative import SpeculativeSetting
from tests.support.ports import free_port

COMMANDS = {
    "up", "down", "join", "watch", "job", "cancel", "logs", "jobs", "status", "demo", "serve",
    "certs", "token", "trace", "plot", "spec", "calibrate",
    "submit kernel", "submit coe", "submit train",
    "fault kill-socket", "fault kill-agent", "fault slow", "fault drop-link",
    "fault delay-link", "fault partition", "fault heal", "fault list",
    "predict fusion", "predict decode", "predict serve", "predict coe", "predict ddp",
    "predict footprint",
    "bench paper", "bench assumptions",
}  # fmt: skip
CONNECTION = ["address", "token", "token_file", "tls_ca", "tls_server_name"]
SPECULATIVE = ["speculative", "draft_model", "draft_tokens", "acceptance"]
# A line break with text on both sides: inside a paragraph, where the terminal should wrap.
BREAK_INSIDE_A_PARAGRAPH = re.compile(r"[^\n]\n[^\n]")


def _tree(command: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every command and group below `command` (a click command), by its path."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _tree(sub, f"{path} {name}".strip())


def _commands() -> dict[str, Any]:
    return dict(_tree(typer.main.get_command(build_app())))


def test_every_command_is_in_its_place_in_the_listed_order() -> None:
    found = _commands()
    leaves = {path for path, c in found.items() if not hasattr(c, "commands")}
    assert leaves == COMMANDS
    assert list(found[""].commands) == [
        "up", "down", "join", "watch", "job", "cancel", "logs", "jobs", "status", "demo", "serve",
        "certs", "token", "trace", "plot", "spec", "calibrate", "submit", "fault", "predict",
        "bench",
    ]  # fmt: skip
    assert list(found["submit"].commands) == ["kernel", "coe", "train"]


@pytest.mark.parametrize("path", sorted(_commands()), ids=lambda p: p or "rdu")
def test_no_help_text_breaks_inside_a_paragraph(path: str) -> None:
    """typer keeps a help text's line breaks: one inside a paragraph breaks a sentence
    in `rdu --help` wherever the terminal is wider than the source."""
    command = _commands()[path]
    texts = {"help": command.help or ""}
    texts |= {f"--{p.name}": getattr(p, "help", None) or "" for p in command.params}
    broken = {k: v for k, v in texts.items() if BREAK_INSIDE_A_PARAGRAPH.search(v.strip())}
    assert not broken, broken


def test_paragraphs_joins_lines_and_keeps_paragraphs() -> None:
    doc = """First line
        goes on.

        Second paragraph,
        two lines."""
    assert paragraphs(doc) == "First line goes on.\n\nSecond paragraph, two lines."


def test_importing_the_cli_registers_nothing() -> None:
    """No module holds an application or a group: build_app makes each, every time."""
    for info in pkgutil.iter_modules(rdurack.cli.__path__):
        module = importlib.import_module(f"rdurack.cli.{info.name}")
        held = [n for n, v in vars(module).items() if isinstance(v, typer.Typer)]
        assert not held, f"{module.__name__}: {held}"
    assert build_app() is not build_app()


def test_client_commands_show_the_connection_options_in_place_of_their_target() -> None:
    seen: list[tuple[int, Target, bool]] = []

    def probe(count: int = 1, *, to: Target, as_json: bool = False) -> None:
        seen.append((count, to, as_json))

    wrapped = talks_to_orchestrator(probe)
    names = list(inspect.signature(wrapped).parameters)
    assert names == ["count", *CONNECTION, "as_json"]
    wrapped(
        count=2, address="host:1", token="t", token_file=None, tls_ca=None,
        tls_server_name="", as_json=True,
    )  # fmt: skip
    assert seen == [(2, Target("host:1", "t", None), True)]


def test_speculating_commands_show_the_speculative_options_in_place_of_the_setting() -> None:
    seen: list[tuple[int, SpeculativeSetting | None]] = []

    def probe(count: int = 1, speculative: SpeculativeSetting | None = None) -> None:
        seen.append((count, speculative))

    wrapped = speculates(probe)
    names = list(inspect.signature(wrapped).parameters)
    assert names == ["count", *SPECULATIVE]
    wrapped(count=2, speculative=True, draft_model=None, draft_tokens=3, acceptance=0.5)
    wrapped(count=3, speculative=False, draft_model=None, draft_tokens=4, acceptance=0.8)
    assert seen == [(2, SpeculativeSetting(draft_tokens=3, acceptance=0.5)), (3, None)]
    commands = _commands()
    for path in ("predict decode", "predict serve", "submit kernel"):
        params = [p.name for p in commands[path].params]
        assert params[params.index("speculative") :][:4] == SPECULATIVE, path


def test_a_call_to_no_orchestrator_is_one_line_naming_it_and_exit_1() -> None:
    address = f"127.0.0.1:{free_port()}"

    def get(*, to: Target) -> None:
        with to.channel() as ch:
            JobClient(ch, timeout_s=10).get("job-1")

    with pytest.raises(RackCallFailed) as failed:
        talks_to_orchestrator(get)(
            address=address, token="", token_file=None, tls_ca=None, tls_server_name=""
        )
    assert failed.value.exit_code == 1
    assert str(failed.value).startswith(f"the orchestrator at {address} is unavailable")


def test_a_token_and_a_token_file_are_one_too_many(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("\n")
    with pytest.raises(RdurackError, match="give one of them"):
        Target.from_options("a:1", token="t", token_file=token_file)
    with pytest.raises(RdurackError, match="the file is empty"):
        Target.from_options("a:1", token_file=token_file)
