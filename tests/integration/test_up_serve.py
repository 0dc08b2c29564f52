"""`rdu up --serve`: the rack and an OpenAI-compatible endpoint on it, as a user starts
them; the official client gets a completion whose passes ran on the rack's sockets, and
`rdu down` stops the endpoint first, which releases its sockets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from openai import OpenAI

from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.store import JobStore
from tests.support.cli import rdu
from tests.support.ports import free_port

pytestmark = pytest.mark.integration


def test_up_serve_answers_on_the_racks_sockets_and_down_releases_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    address = ["--address", f"127.0.0.1:{free_port()}"]
    try:
        up = rdu(
            "up", "--state-dir", str(state), "--port", address[1].split(":")[1],
            "--nodes", "1", "--sockets-per-node", "2",
            "--serve", "llama3.1-8b", "--serve-sockets", "2", "--serve-port", "0",
            timeout=180,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        found = re.search(r"endpoint\s+ready at (127\.0\.0\.1:\d+)", up.stdout)
        assert found, up.stdout

        client = OpenAI(base_url=f"http://{found.group(1)}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == ["llama3.1-8b"]
        done = client.completions.create(model="llama3.1-8b", prompt="hello rack", max_tokens=4)
        assert done.usage is not None and done.usage.completion_tokens == 4

        status = json.loads(rdu("status", "--json", *address).stdout)
        holders = {s["job"] for s in status["sockets"]}
        assert len(holders) == 1 and None not in holders  # the endpoint job holds both
        (job_id,) = holders
        assert all(s["emulated_clock_ns"] > 0 for s in status["sockets"])  # the passes ran there
    finally:
        down = rdu("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert down.stdout.splitlines()[0].startswith("endpoint (pid ")  # stopped first
    store = JobStore(state / "jobs.sqlite")
    try:
        job = store.get(job_id)
        assert job.state is JobState.CANCELLED and "the endpoint stopped" in job.error
    finally:
        store.close()
