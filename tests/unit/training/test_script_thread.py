"""A script rank in a thread: calls come back between its steps, its errors reach the
caller, and a job can stop it (node_agent/training/script_thread.py). The scripts here
are functions driven by events, step by step: no sleeps, no timing assertions."""

from __future__ import annotations

import threading

import pytest
import torch

from rdurack.errors import RdurackError
from rdurack.node_agent.training.script_thread import ScriptThread
from rdurack.node_agent.training.script_time import Pricing, ScriptStopped, Streams
from rdurack.rack.clock import EmulatedClock
from tests.unit.training.test_script_time import EachOp

LONG_S = 30.0  # a window no test waits out: each returns on a step or the end


def _streams() -> Streams:
    return Streams(EmulatedClock(0), EachOp())


def _stepper(streams: Streams, steps: int, go: threading.Semaphore) -> None:
    """A script of `steps` optimizer steps, each when `go` is released."""
    for _ in range(steps):
        assert go.acquire(timeout=LONG_S)
        streams.step_began()
        streams.step_ended()


def test_each_call_comes_back_after_its_steps_and_the_last_at_the_end() -> None:
    streams, go = _streams(), threading.Semaphore(0)
    thread = ScriptThread(lambda: _stepper(streams, 3, go), streams, 3600, "rank 0")
    go.release(2)
    assert thread.wait(2, LONG_S) is False and streams.steps == 2
    go.release()
    assert thread.wait(5, LONG_S) is True and streams.steps == 3  # ended before 5 more


def test_a_call_comes_back_after_its_window_or_with_no_steps_asked_at_the_end() -> None:
    streams, go = _streams(), threading.Semaphore(0)
    thread = ScriptThread(lambda: _stepper(streams, 2, go), streams, 3600, "rank 0")
    assert thread.wait(1, 0.0) is False and streams.steps == 0  # the window, no step
    go.release(2)
    assert thread.wait(0, 0.0) is True and streams.steps == 2  # 0 steps: to the end


def test_the_scripts_error_reaches_the_caller() -> None:
    streams = _streams()

    def fails() -> None:
        raise ValueError("bad batch")

    thread = ScriptThread(fails, streams, 3600, "rank 1")
    with pytest.raises(ValueError, match="bad batch"):
        thread.wait(1, LONG_S)


def _spins(streams: Streams, started: threading.Event, cleaned: list[str]) -> None:
    """A script that runs torch operators until something stops it."""
    x = torch.ones(4)
    try:
        with Pricing(streams):
            started.set()
            while True:
                x = x + 1
    finally:
        cleaned.append("finally ran")


def test_stop_raises_inside_the_script_at_its_next_operator() -> None:
    streams, started, cleaned = _streams(), threading.Event(), list[str]()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _spins(streams, started, cleaned)
        except ScriptStopped as e:
            errors.append(e)
            raise

    thread = ScriptThread(run, streams, 3600, "rank 0")
    assert started.wait(LONG_S)
    thread.stop("its job ended")
    assert not thread.alive and cleaned == ["finally ran"]
    assert [str(e) for e in errors] == ["its job ended"]
    with pytest.raises(ScriptStopped, match="its job ended"):
        thread.wait(1, LONG_S)


def test_a_script_past_its_run_timeout_is_stopped() -> None:
    streams, started, cleaned = _streams(), threading.Event(), list[str]()
    thread = ScriptThread(lambda: _spins(streams, started, cleaned), streams, 0.0, "rank 0")
    with pytest.raises(ScriptStopped, match=r"ran past run_timeout_s \(0 s\)"):
        thread.wait(1, LONG_S)
    assert cleaned == ["finally ran"]


def test_a_script_with_no_operator_to_stop_at_is_named() -> None:
    streams, release = _streams(), threading.Event()
    thread = ScriptThread(lambda: release.wait(LONG_S), streams, 3600, "rank 3 (rdu-n0-s3)")
    with pytest.raises(RdurackError, match=r"rank 3 \(rdu-n0-s3\) was stopped .* still running"):
        thread.stop("its job ended", timeout_s=0.0)
    assert thread.alive
    release.set()
    assert thread.join(LONG_S)
