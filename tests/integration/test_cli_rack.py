"""`rdu up`, a job through the CLI, `rdu down`: the real commands, as a user runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from rdurack.processes import local_rack
from tests.support.cli import rdu
from tests.support.ports import free_port

pytestmark = pytest.mark.integration


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _gone(pid: int, within_s: float = 20) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_up_submit_watch_cancel_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port()
    address = ["--address", f"127.0.0.1:{port}"]
    pids: dict[str, int] = {}
    try:
        done = rdu(
            "up",
            "--state-dir",
            str(state),
            "--port",
            str(port),
            "--nodes",
            "1",
            "--sockets-per-node",
            "2",
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert f"orchestrator   ready at 127.0.0.1:{port}" in done.stdout
        # The local default is open and plaintext, and says so.
        assert "security: plaintext on loopback (127.0.0.1); unauthenticated" in done.stdout
        pids = json.loads((state / "rack.json").read_text())["pids"]
        assert set(pids) == {"ray-head", "node-agent-0", "orchestrator"}

        # A second `up` in the same state dir refuses, in one line.
        again = rdu("up", "--state-dir", str(state), "--port", str(free_port()))
        assert again.returncode == 2
        assert "already up" in again.stderr and len(again.stderr.splitlines()) == 1

        rack = _json(rdu("status", "--json", *address))
        assert [s["id"] for s in rack["sockets"]] == ["rdu-n0-s0", "rdu-n0-s1"]
        assert {s["health"] for s in rack["sockets"]} == {"HEALTHY"}
        # One orchestrator: it leads, named by its address, in the store's first term.
        replica = f"127.0.0.1:{port}"
        assert rack["control_plane"] == {"replica": replica, "leader": replica, "term": 1}

        job = _json(
            rdu(
                "submit",
                "kernel",
                "--model",
                "llama2-7b",
                "--phase",
                "decode",
                "--sockets",
                "2",
                "--output-tokens",
                "5",
                "--name",
                "cli test",
                "--wait",
                "--json",
                *address,
            )
        )
        assert job["state"] == "SUCCEEDED", job
        assert job["emulated_s"] > 0
        assert job["kernel_calls"] > 0
        assert job["tokens_per_s"] > 0
        assert job["error"] is None

        # A CoE job from a trace file, the summary as JSON.
        trace = tmp_path / "trace.jsonl"
        trace.write_text(
            '{"arrival_s": 0, "prompt": "fix this python bug"}\n'
            '{"arrival_s": 0.5, "prompt_tokens": 64, "expert": "law-contracts"}\n'
        )
        coe = _json(
            rdu(
                "submit", "coe", "--experts", "10", "--sockets", "2", "--trace", str(trace),
                "--output-tokens", "4", "--wait", "--json", *address,
            )
        )  # fmt: skip
        assert coe["state"] == "SUCCEEDED", coe
        assert coe["requests"] == 2 and coe["oom"] is False and coe["diagnostics"] == []
        assert coe["switch_s"] > 0 and 0 <= coe["hbm_hit_rate"] <= 1 and coe["tokens_per_s"] > 0
        assert [r["expert"] for r in coe["per_request"]][1] == "law-contracts"

        # Progressive training under an HBM cap that full training of the model cannot
        # meet: the full job is refused in one line with the numbers, progressive runs.
        model = ["--world-size", "2", "--global-batch", "32", "--blocks", "3", "--hidden", "32"]
        cap = ["--hbm-cap-bytes", "50000", "--steps", "4", "--dataset", "synthetic"]
        full = rdu("submit", "train", *model, *cap, "--wait", "--json", *address)
        assert full.returncode == 2 and len(full.stderr.splitlines()) == 1, full.stderr
        assert "HBM cannot hold" in full.stderr and "50,000 bytes free" in full.stderr
        grown = _json(
            rdu("submit", "train", "--strategy", "progressive", *model, *cap, "--wait",
                "--json", *address)
        )  # fmt: skip
        assert grown["state"] == "SUCCEEDED", grown
        assert grown["strategy"] == "progressive" and grown["peak_hbm_bytes"] <= 50_000
        assert [st["name"] for st in grown["stages"]][::3] == ["shrink block 2", "grow block 0"]
        for key in ("test_accuracy", "final_loss", "step_time_s", "samples_per_s", "memory"):
            assert grown[key] is not None, key
        assert [m["socket_id"] for m in grown["socket_memory"]] == ["rdu-n0-s0", "rdu-n0-s1"]
        # `rdu plot` draws its stages from the trace files (flushed every 0.5 s).
        plots, stages_png = tmp_path / "plots", f"{grown['job_id']}-stages.png"
        deadline = time.monotonic() + 30
        while not (plots / stages_png).is_file():
            assert time.monotonic() < deadline, "no stage figure within 30 s"
            drawn = rdu("plot", grown["job_id"], "--out", str(plots), "--state-dir", str(state))
            time.sleep(0.5)
        assert drawn.returncode == 0, drawn.stderr
        assert (plots / f"{grown['job_id']}-timeline.png").is_file()

        listed = _json(rdu("jobs", "--json", *address))["jobs"]
        assert job["job_id"] in [j["job_id"] for j in listed]
        assert _json(rdu("job", job["job_id"], "--json", *address))["state"] == "SUCCEEDED"

        # Cancelling a finished job: FAILED_PRECONDITION, one line, exit 2.
        cancel = rdu("cancel", job["job_id"], *address)
        assert cancel.returncode == 2, cancel.stderr
        assert cancel.stderr.startswith("rdu: ") and len(cancel.stderr.splitlines()) == 1

        # Too many sockets for the rack: refused, one line, exit 2.
        big = rdu("submit", "kernel", "--model", "llama2-7b", "--phase", "decode", *address)
        assert big.returncode == 2 and len(big.stderr.splitlines()) == 1, big.stderr
    finally:
        down = rdu("down", "--state-dir", str(state), timeout=120)
    assert down.returncode == 0, down.stderr
    assert not (state / "rack.json").exists()
    for name, pid in pids.items():
        assert _gone(pid), f"{name} (pid {pid}) still runs after rdu down"
    # Nothing is up now: client commands say so in one line, exit 1.
    status = rdu("status", *address)
    assert status.returncode == 1
    assert "rdu up" in status.stderr and len(status.stderr.splitlines()) == 1


def test_down_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        record = {"pids": {"orchestrator": sleeper.pid}, "addresses": {}}
        (tmp_path / "rack.json").write_text(json.dumps(record))
        lines = local_rack.down(tmp_path, wait_s=1)
        assert lines == [f"orchestrator (pid {sleeper.pid}): not running"]
        assert sleeper.poll() is None, "down signalled a process whose cmdline lacks rdurack"
        assert not (tmp_path / "rack.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_without_a_rack_says_so(tmp_path: Path) -> None:
    assert local_rack.down(tmp_path) == [f"no rack is up in {tmp_path} (no rack.json)"]
    done = rdu("down", "--state-dir", str(tmp_path))
    assert done.returncode == 0 and "no rack is up" in done.stdout


def test_up_names_the_process_that_failed(tmp_path: Path) -> None:
    # A port another server holds: the orchestrator cannot bind it, so up fails, names
    # the orchestrator with the end of its log, and stops what it had started.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = rdu(
            "up",
            "--state-dir",
            str(tmp_path),
            "--port",
            str(port),
            "--nodes",
            "1",
            "--sockets-per-node",
            "1",
            timeout=180,
        )
    assert done.returncode == 2
    assert done.stderr.startswith("rdu: orchestrator exited with code"), done.stderr
    assert not (tmp_path / "rack.json").exists()
