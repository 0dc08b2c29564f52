"""Fixtures of the trace tests: a trace dir written by a provider per service, two
jobs traced into it, and `rdu` run in this process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdurack.cli import main as cli
from tests.support.traces import Services, write_job


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    s = Services(tmp_path / "traces")
    yield s
    s.close()


@pytest.fixture
def job_dir(services: Services) -> Path:
    """Two jobs traced into one directory."""
    write_job(services, "job-a")
    write_job(services, "job-b")
    return services.directory


class Rdu:
    """`rdu ARGS` in this process: (exit code, stdout, stderr)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.monkeypatch.setattr(sys, "argv", ["rdu", *args])
        self.monkeypatch.delenv("RDURACK_TRACE_DIR", raising=False)
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def rdu(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Rdu:
    return Rdu(capsys, monkeypatch)
