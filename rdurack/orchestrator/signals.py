"""Wake-ups for the watchers of one job (WatchJob streams), not of every job.

A watcher re-reads its job's events from the store when woken. Woken on every event of
every job, 100 watchers turned each event into 100 wake-ups and some 300 store queries;
here only the watchers of the job that changed wake up. A watcher that misses nothing
reads the version before it queries the store and waits for it to move past that, so a
change between its query and its wait still wakes it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Slot:
    """One watched job: how many changes it had, and its watchers' condition."""

    def __init__(self, lock: threading.Lock) -> None:
        self.version = 0
        self.watchers = 0
        self.changed = threading.Condition(lock)


class Watch:
    """A watcher's handle on its job's slot (from JobSignals.watching)."""

    def __init__(self, signals: JobSignals, slot: _Slot) -> None:
        self._signals = signals
        self._slot = slot
        self.gone = False  # its client went away (hang_up)

    def hang_up(self) -> None:
        """The watcher's client went away: wake it now, to end its watch (a WatchJob
        stream's thread is free at once, not at its next poll)."""
        with self._slot.changed:
            self.gone = True
            self._slot.changed.notify_all()

    def version(self) -> int:
        with self._slot.changed:
            return self._slot.version

    def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the job changed after version `seen`, the client hung up,
        everything stops, or `timeout_s` seconds (wall time) passed."""
        with self._slot.changed:
            self._slot.changed.wait_for(
                lambda: self._slot.version != seen or self.gone or self._signals.stopped,
                timeout_s,
            )


class JobSignals:
    """Per-job change signals; a slot exists only while its job has watchers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self.stopped = False

    @contextmanager
    def watching(self, job_id: str) -> Iterator[Watch]:
        """Register a watcher of `job_id` for the block's duration."""
        with self._lock:
            slot = self._slots.get(job_id)
            if slot is None:
                slot = self._slots[job_id] = _Slot(self._lock)
            slot.watchers += 1
        try:
            yield Watch(self, slot)
        finally:
            with self._lock:
                slot.watchers -= 1
                if not slot.watchers:
                    del self._slots[job_id]

    def notify(self, job_id: str) -> None:
        """`job_id` has a new event: wake its watchers (none: nothing to do)."""
        with self._lock:
            slot = self._slots.get(job_id)
            if slot is not None:
                slot.version += 1
                slot.changed.notify_all()

    def stop(self) -> None:
        """Wake every watcher for good (the orchestrator stops)."""
        with self._lock:
            self.stopped = True
            for slot in self._slots.values():
                slot.changed.notify_all()

    def watched(self) -> int:
        """Jobs with at least one watcher."""
        with self._lock:
            return len(self._slots)
