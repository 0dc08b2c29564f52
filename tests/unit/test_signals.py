"""JobSignals: a job's news wakes its watchers only, and no news is lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rdurack.orchestrator.signals import JobSignals
from tests.support.fake_rack import until

# A wait's timeout, s: far longer than any wake-up takes even on a loaded machine, so a
# wait that returns in under half of it was woken, not timed out.
WAIT_S = 20.0


def _waiter(signals: JobSignals, job_id: str, woke: dict[str, float]) -> threading.Thread:
    ready = threading.Event()

    def run() -> None:
        with signals.watching(job_id) as w:
            seen = w.version()
            ready.set()
            start = time.monotonic()
            w.wait(seen, timeout_s=WAIT_S)
            woke[job_id] = time.monotonic() - start

    t = threading.Thread(target=run)
    t.start()
    assert ready.wait(2)
    return t


def test_notify_wakes_the_watchers_of_that_job_only() -> None:
    signals = JobSignals()
    woke: dict[str, float] = {}
    a, b = _waiter(signals, "a", woke), _waiter(signals, "b", woke)
    signals.notify("a")
    a.join(WAIT_S)
    assert "a" in woke and woke["a"] < WAIT_S / 2  # woken, not timed out
    with signals.watching("b") as other:
        assert other.version() == 0  # b's job had no news: nothing can wake its watcher
    assert "b" not in woke  # still waiting
    signals.stop()
    b.join(WAIT_S)
    assert woke["b"] < WAIT_S / 2  # stop wakes everyone
    assert signals.watched() == 0  # slots go with their last watcher


def test_a_change_between_reading_and_waiting_is_not_lost() -> None:
    signals = JobSignals()
    with signals.watching("j") as w:
        seen = w.version()
        signals.notify("j")  # the job changed after the watcher read the store
        start = time.monotonic()
        w.wait(seen, timeout_s=WAIT_S)
        assert time.monotonic() - start < WAIT_S / 2  # returns at once: it must re-read


def test_wait_times_out_without_news_and_notify_without_watchers_is_free() -> None:
    signals = JobSignals()
    signals.notify("nobody")  # keeps nothing
    assert signals.watched() == 0
    with signals.watching("j") as w:
        start = time.monotonic()
        w.wait(w.version(), timeout_s=0.05)
        assert 0.04 <= time.monotonic() - start < WAIT_S / 2


def test_a_hang_up_wakes_that_watcher_only() -> None:
    signals = JobSignals()
    woke: dict[str, float] = {}
    hang_ups: list[Callable[[], None]] = []
    gone: list[float] = []  # how long the hung-up watcher waited, s

    def leaving() -> None:
        with signals.watching("j") as w:
            seen = w.version()
            hang_ups.append(w.hang_up)
            start = time.monotonic()
            w.wait(seen, timeout_s=WAIT_S)
            if w.gone:
                gone.append(time.monotonic() - start)

    stays = _waiter(signals, "j", woke)  # another watcher of the same job
    left = threading.Thread(target=leaving)
    left.start()
    until(lambda: hang_ups, "the leaving watcher registered", WAIT_S)
    hang_ups[0]()
    left.join(WAIT_S)
    assert gone and gone[0] < WAIT_S / 2  # woken, not timed out
    assert "j" not in woke  # the other still waits: its client is there
    signals.stop()
    stays.join(WAIT_S)
