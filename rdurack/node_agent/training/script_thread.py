"""A script rank running in a thread of its socket's actor process, so that the job's
calls come back between its steps: each `wait` returns after some optimizer steps, at
the script's end, or after a window of wall time, whichever comes first. The
orchestrator shows the step count between calls, and can stop the script.

Stopping (`stop`): the script's next torch operator raises `ScriptStopped` inside it,
which unwinds its `with` blocks and `finally` clauses as any exception would; then the
thread is waited for. A script busy in pure Python (a sleep, a loop without torch
operators) cannot be interrupted: `stop` gives up after its timeout and says so, and
the socket refuses a new script until that thread has ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rdurack.errors import RdurackError
from rdurack.node_agent.training.script_time import Streams
from rdurack.workloads.training.job import SCRIPT_STOP_S


class ScriptThread:
    """`run` (one rank's script, priced on `streams`) in a thread of its own, at most
    `run_timeout_s` wall seconds; `name` is the rank's, for messages."""

    def __init__(
        self, run: Callable[[], object], streams: Streams, run_timeout_s: float, name: str
    ) -> None:
        self.streams = streams
        self.name = name
        self.run_timeout_s = run_timeout_s
        self._deadline = time.monotonic() + run_timeout_s
        self._changed = threading.Condition()  # a step ended, or the script did
        self._done = False
        self._error: BaseException | None = None
        streams.on_step = self._notify
        self._thread = threading.Thread(target=self._main, args=(run,), name=name, daemon=True)
        self._thread.start()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _main(self, run: Callable[[], object]) -> None:
        try:
            run()
        except BaseException as e:  # the script's own errors: the caller's `wait` raises it
            self._error = e
        finally:
            with self._changed:
                self._done = True
                self._changed.notify_all()

    def wait(self, steps: int, window_s: float) -> bool:
        """Until `steps` more optimizer steps or `window_s` wall seconds (steps 0: until
        its end), or the script's end; whether the script has ended. Raises the script's
        error, and stops a script that ran past `run_timeout_s`."""
        target = self.streams.steps + steps if steps else None
        end = min(time.monotonic() + window_s, self._deadline) if steps else self._deadline
        with self._changed:
            self._changed.wait_for(
                lambda: self._done or (target is not None and self.streams.steps >= target),
                timeout=max(0.0, end - time.monotonic()),
            )
        if not self._done and time.monotonic() >= self._deadline:
            self.stop(f"it ran past run_timeout_s ({self.run_timeout_s:g} s)")
        if self._done:
            if self._error is not None:
                raise self._error
            return True
        return False

    def request_stop(self, reason: str) -> None:
        """Ask the script to stop for `reason`: its next operator raises ScriptStopped
        (and whatever it raises from now on is reported as stopped for `reason`)."""
        if not self._done and self.streams.stop_reason is None:
            self.streams.stop_reason = reason

    def stop(self, reason: str, timeout_s: float = SCRIPT_STOP_S) -> None:
        """Stop the script for `reason` (`request_stop`) and wait up to `timeout_s` for
        its thread. Raises if the thread is still running."""
        self.request_stop(reason)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RdurackError(
                f"{self.name} was stopped ({reason}) but is still running after "
                f"{timeout_s:g} s: it runs no torch operator that could stop it (a sleep, "
                "a pure-Python loop); its socket takes no other script until it ends"
            )

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the thread; whether it has ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
