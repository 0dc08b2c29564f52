"""k8s/components/ha-control-plane's orchestrator pod against a real PostgreSQL server
(tests/support/postgres.py): the URL from the Secret, with no password in it, opens the
store once libpq has the password from PGPASSWORD, and not without it; the orchestrator
on that store writes nothing under its state dir (why an emptyDir is enough); and the
init container keeps waiting while nothing answers, and ends once the server does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rdurack.devtools.postgres import PostgresServer, program
from rdurack.errors import InvalidRequest
from rdurack.orchestrator.store import JobStore
from tests.support.manifests import Obj, find
from tests.support.orchestrator_pod import orchestrator, pod_env, settings, variables
from tests.support.ports import free_port

HA = "rack16"  # the overlay that lists the component
SECRET = "rdurack-postgres"
STILL_WAITING_S = 4.0  # how long the init container must keep waiting for no server
START_S = 60.0  # the orchestrator's start on a loaded machine, wall s
RUN_S = 2.0  # then a few scheduling rounds (0.5 s) and heartbeats, wall s


def _without_password(url: str) -> str:
    """The test server's URL as the Secret holds one: user, host, port, database."""
    parts = urlsplit(url)
    return f"postgresql://{parts.username}@{parts.hostname}:{parts.port}{parts.path}"


def test_the_orchestrator_opens_the_store_with_the_pods_variables(
    rendered: dict[str, list[Obj]], postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, c = orchestrator(rendered[HA])
    monkeypatch.setenv("PGPASSFILE", os.devnull)  # no ~/.pgpass of this machine's
    with postgres.database() as full:
        url = _without_password(full)
        secrets = {(SECRET, "url"): url, (SECRET, "password"): postgres.password}
        read = settings(c, secrets, monkeypatch)
        assert read.store == url and urlsplit(read.store).password is None
        assert os.environ["PGPASSWORD"] == postgres.password
        JobStore(read.store).close()
        monkeypatch.setenv("PGPASSWORD", "not-" + postgres.password)
        with pytest.raises(InvalidRequest, match="password authentication failed"):
            JobStore(read.store)


def test_the_orchestrator_on_the_store_writes_nothing_in_its_state_dir(
    rendered: dict[str, list[Obj]], postgres: PostgresServer, tmp_path: Path
) -> None:
    """The pod's command and variables, with its paths and addresses made local: it
    starts, serves, schedules (its agents are not there) and stops, and leaves its state
    dir, the checkpoint path and its working directory as empty as it found them."""
    docs = rendered[HA]
    _, c = orchestrator(docs)
    spec = tmp_path / "platform.yaml"
    spec.write_text(find(docs, "ConfigMap", "rdurack-spec")["data"]["platform.yaml"])
    state, checkpoints, cwd = tmp_path / "state", tmp_path / "checkpoints", tmp_path / "cwd"
    state.mkdir()
    cwd.mkdir()
    log = tmp_path / "orchestrator.log"
    with postgres.database() as full:
        secrets = {
            (SECRET, "url"): _without_password(full),
            (SECRET, "password"): postgres.password,
        }
        env = pod_env(c, secrets)
        local = {"RDURACK_STATE_DIR": state, "RDURACK_CHECKPOINT_DIR": checkpoints,
                 "RDURACK_SPEC": spec}  # fmt: skip
        assert local.keys() <= env.keys()
        env |= {name: str(path) for name, path in local.items()}
        agents = env["RDURACK_AGENTS"].split(",")
        env |= {
            "RDURACK_HOST": "127.0.0.1",
            "RDURACK_ORCHESTRATOR_PORT": str(free_port()),
            "RDURACK_HEALTH_PORT": str(free_port()),
            "RDURACK_AGENTS": ",".join(f"127.0.0.1:{free_port()}" for _ in agents),
        }
        # Plaintext and open here (no Secrets' files), and no collector: not what this
        # is about. Nothing of this shell's rdurack or tracing settings either.
        for name in ("RDURACK_TLS_CA", "RDURACK_TLS_CERT", "RDURACK_TLS_KEY", "RDURACK_TOKENS",
                     "OTEL_EXPORTER_OTLP_ENDPOINT"):  # fmt: skip
            env.pop(name)
        shell = {k: v for k, v in os.environ.items() if k not in variables()}
        shell = {k: v for k, v in shell.items() if not k.startswith(("RDURACK_", "OTEL_"))}
        command = [sys.executable, *c["command"][1:]]  # `python` is the image's
        with log.open("w") as out:
            proc = subprocess.Popen(
                command, env=shell | env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            deadline = time.monotonic() + START_S
            while "orchestrator ready at" not in log.read_text():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            time.sleep(RUN_S)
        finally:
            proc.terminate()
            code = proc.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    assert list(state.iterdir()) == [] and list(cwd.iterdir()) == []
    assert not checkpoints.exists()


def test_the_init_container_waits_until_the_store_answers(
    rendered: dict[str, list[Obj]], postgres: PostgresServer, tmp_path: Path
) -> None:
    """Its own command, with its own variable: it keeps waiting while nothing answers
    at the URL, and ends once the server does."""
    deployment, c = orchestrator(rendered[HA])
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["env"] == [e for e in c["env"] if e["name"] == "RDURACK_STORE"]
    path = f"{Path(program('pg_isready')).parent}:{os.environ['PATH']}"

    def start(url: str) -> subprocess.Popen[bytes]:
        env = {"PATH": path, "RDURACK_STORE": url, "HOME": str(tmp_path)}
        return subprocess.Popen(init["command"], env=env, stdout=subprocess.DEVNULL)

    nobody = start(f"postgresql://rdurack@127.0.0.1:{free_port()}/rdurack")
    try:
        time.sleep(STILL_WAITING_S)
        assert nobody.poll() is None, "it stopped waiting with no server to answer"
    finally:
        nobody.kill()
        nobody.wait()
    answered = start(_without_password(postgres.url()))
    try:
        assert answered.wait(timeout=30) == 0
    finally:
        answered.kill()  # still waiting (the test failed): not left behind
        answered.wait()
