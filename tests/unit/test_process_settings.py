"""The processes' settings: flags, else their variables, else defaults; a bad value or
flag is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rdurack.orchestrator.health import DEAD_AFTER_S
from rdurack.processes import node_agent_main, orchestrator_main, ray_head
from rdurack.processes.node_agent_main import NodeAgentSettings
from rdurack.processes.orchestrator_main import OrchestratorSettings
from rdurack.processes.settings import SettingsRefused, load
from tests.support.ports import free_port

# Every variable the processes read, cleared so the machine's own cannot leak in.
VARIABLES = (
    "RDURACK_AGENTS",
    "RDURACK_STATE_DIR",
    "RDURACK_STORE",
    "RDURACK_HOST",
    "RDURACK_ORCHESTRATOR_PORT",
    "RDURACK_AGENT_PORT",
    "RDURACK_PLATFORM",
    "RDURACK_SPEC",
    "RDURACK_RECOVERY",
    "RDURACK_CHECKPOINT_DIR",
    "RDURACK_METRICS_PORT",
    "RDURACK_DEAD_AFTER",
    "RDURACK_TOKENS",
    "RDURACK_HEALTH_PORT",
    "RDURACK_NODE_INDEX",
    "RDURACK_TIME_SCALE",
    "RDURACK_TLS_CA",
    "RDURACK_TLS_CERT",
    "RDURACK_TLS_KEY",
    "RDURACK_TLS_RACK_IDENTITY",
    "RAY_ADDRESS",
    "RDURACK_PORT",
    "PORT",
)


LOOPBACK, RACK16 = "127.0.0.1", "sn40l-rack16"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_defaults_are_todays() -> None:
    o = load(OrchestratorSettings, [])
    assert (o.agent_addresses, o.state_dir, o.host, o.port) == ([], Path(".state"), LOOPBACK, 50051)
    assert (o.platform, o.spec, o.recovery, o.checkpoint_dir) == (RACK16, None, "retry", None)
    assert (o.metrics_port, o.tokens, o.health_port, o.tls()) == (None, None, None, None)
    assert (o.tls_rack_identity, o.store, o.dead_after) == ("rdurack-rack", "", DEAD_AFTER_S)
    a = load(NodeAgentSettings, [])
    assert (a.node_index, a.platform, a.spec, a.ray_address) == (0, RACK16, None, "")
    assert (a.host, a.port, a.time_scale, a.health_port) == (LOOPBACK, 0, 0.0, None)


def test_flags_and_variables_both_set_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = load(
        OrchestratorSettings,
        [
            *("--agents", "a:1, b:2", "--port", "7", "--spec", "s.yaml", "--recovery=fail"),
            *("--metrics-port", "9100", "--tls-rack-identity", "rack-b"),
            *("--store", "postgresql://db/jobs", "--dead-after", "10"),
        ],
    )
    assert flags.agent_addresses == ["a:1", "b:2"]
    assert (flags.port, flags.spec, flags.recovery) == (7, Path("s.yaml"), "fail")
    assert (flags.metrics_port, flags.tls_rack_identity) == (9100, "rack-b")
    assert (flags.store, flags.dead_after) == ("postgresql://db/jobs", 10.0)
    for name, value in {
        "RDURACK_AGENTS": "a:1,b:2",
        "RDURACK_ORCHESTRATOR_PORT": "8",
        "RDURACK_SPEC": "t.yaml",
        "RDURACK_RECOVERY": "fail",
        "RDURACK_METRICS_PORT": "9101",
        "RDURACK_TLS_RACK_IDENTITY": "rack-c",
        "RDURACK_STORE": "/var/lib/rdurack/jobs.sqlite",
        "RDURACK_DEAD_AFTER": "7.5",
        "RDURACK_NODE_INDEX": "1",
        "RDURACK_AGENT_PORT": "50061",
        "RDURACK_TIME_SCALE": "0.5",
        "RAY_ADDRESS": "auto",
    }.items():
        monkeypatch.setenv(name, value)
    variables = load(OrchestratorSettings, [])
    assert variables.agent_addresses == ["a:1", "b:2"]
    assert (variables.port, variables.spec, variables.recovery) == (8, Path("t.yaml"), "fail")
    assert (variables.metrics_port, variables.tls_rack_identity) == (9101, "rack-c")
    assert (variables.store, variables.dead_after) == ("/var/lib/rdurack/jobs.sqlite", 7.5)
    agent = load(NodeAgentSettings, [])
    assert (agent.node_index, agent.port, agent.time_scale, agent.ray_address) == (
        1,
        50061,
        0.5,
        "auto",
    )


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDURACK_ORCHESTRATOR_PORT", "8")
    monkeypatch.setenv("RDURACK_HOST", "0.0.0.0")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    settings = load(OrchestratorSettings, ["--port", "7"])
    assert (settings.port, settings.host) == (7, "0.0.0.0")
    assert load(NodeAgentSettings, ["--ray-address", "auto"]).ray_address == "auto"


def test_only_the_named_variables_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port is RDURACK_ORCHESTRATOR_PORT or RDURACK_AGENT_PORT, never PORT or
    RDURACK_PORT; names are exact; an empty variable is unset."""
    monkeypatch.setenv("PORT", "1")
    monkeypatch.setenv("RDURACK_PORT", "2")
    monkeypatch.setenv("rdurack_host", "10.0.0.1")
    monkeypatch.setenv("RDURACK_SPEC", "")
    monkeypatch.setenv("RDURACK_METRICS_PORT", "")
    settings = load(OrchestratorSettings, [])
    assert (settings.port, settings.host, settings.spec, settings.metrics_port) == (
        50051,
        "127.0.0.1",
        None,
        None,
    )
    assert load(NodeAgentSettings, []).port == 0


@pytest.mark.parametrize(
    ("argv", "variables", "line"),
    [
        (
            ["--port", "abc"],
            {},
            "--port abc: Input should be a valid integer, unable to parse string as an integer",
        ),
        ([], {"RDURACK_NODE_INDEX": "-1"}, "RDURACK_NODE_INDEX=-1: Input should be greater"),
        (["--node-index", "-1"], {"RDURACK_NODE_INDEX": "1"}, "--node-index -1: Input should"),
        (["--time-scale", "nan"], {}, "--time-scale nan: Input should be a finite number"),
        (["--port", "70000"], {}, "--port 70000: Input should be less than or equal to 65535"),
        (["--prot", "1"], {}, "unrecognized arguments: --prot 1"),
        (["--port"], {}, "argument --port: expected one argument"),
    ],
)
def test_a_bad_node_agent_setting_is_one_line_and_exit_2(
    argv: list[str],
    variables: dict[str, str],
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert node_agent_main.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"node-agent: {line}"), err


def test_bad_orchestrator_settings_are_one_line_naming_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RDURACK_METRICS_PORT", "many")
    assert orchestrator_main.main(["--recovery", "never"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "orchestrator: --recovery never: Input should be 'retry' or 'fail'; "
        "RDURACK_METRICS_PORT=many: Input should be a valid integer, unable to parse string "
        "as an integer"
    ]


def test_a_store_that_cannot_be_opened_is_one_line_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"postgresql://rdu:s3cret@127.0.0.1:{free_port()}/jobs"  # nothing listens there
    assert orchestrator_main.main(["--agents", "a:1,b:2", "--store", url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("orchestrator: cannot open job store postgresql://rdu:***@127.0.0.1:")
    assert "s3cret" not in line


def test_the_ray_head_takes_no_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert ray_head.main(["--port", "6379"]) == 2
    assert capsys.readouterr().err.splitlines() == ["ray-head: unrecognized arguments: --port 6379"]


def test_help_shows_the_table_of_flags_and_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        orchestrator_main.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "RDURACK_ORCHESTRATOR_PORT" in out and "--port int" in out


def test_a_refusal_is_a_settings_refused() -> None:
    with pytest.raises(SettingsRefused, match="--health-port -5"):
        load(NodeAgentSettings, ["--health-port", "-5"])


def test_the_process_prints_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rdurack.processes.orchestrator_main", "--port", "abc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "orchestrator: --port abc: Input should be a valid integer, unable to parse string "
        "as an integer"
    ]
