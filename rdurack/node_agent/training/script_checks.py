"""The article's mistakes, looked for on a script rank as it runs.

Findings that only cost correctness or efficiency are diagnostics (the run goes on):
- replicas-differ: at the first optimizer step the ranks' parameters are not the same
  (DDP(init_sync=False), or a script that averages gradients itself and never
  broadcasts rank 0's parameters);
- duplicate-samples: the first gradient all-reduce reduces the same gradients on every
  rank (every rank read the same batch: a data loader without a DistributedSampler);
- every-rank-checkpoints: more than one rank saved to the same file (found by the
  orchestrator from each rank's `saved` list).

Mistakes that cannot train stop the rank with an error that names them:
- wrong-world-size / two-processes-per-socket: init_process_group's world size is not
  the job's (larger: ranks would share sockets);
- wrong-rank: the rank passed is not this process's RANK;
- straggler-timeout: a rank reached a step's first gradient all-reduce later than the
  process group's timeout (or the job's timeout_s, whichever is shorter) after the first
  rank (emulated seconds: the time NCCL's watchdog would have waited on the hardware).

The ranks compare what they hold by digests exchanged through the job's rendezvous
store (script.py: a TCPStore rank 0 hosts, as torchrun's agent does): bookkeeping the
hardware does not do, so no emulated time and no link traffic. A step's lateness check
is one such exchange of 8 bytes a rank: two requests to the store each, where a ring
all-gather over the links took 15 rounds of messages between the ranks' processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from rdurack.errors import LinkFailure, RdurackError
from rdurack.rack.clock import EmulatedClock
from rdurack.workloads.training.rank import (
    DUPLICATE_SAMPLES,
    REPLICAS_DIFFER,
    STRAGGLER_TIMEOUT,
    TWO_PROCESSES_PER_SOCKET,
    WRONG_RANK,
    WRONG_WORLD_SIZE,
)


class ScriptMistake(RdurackError):
    """A mistake the script cannot train with, named by its code."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"[{code}] {message}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.code, str(self).removeprefix(f"[{self.code}] ")))


WAIT_SLICE_S = 0.25  # a wait at the store looks this often whether the rank was stopped


@dataclass
class Checks:
    """Rank `rank` of a job on `sockets` (by rank), comparing notes through `store`
    (the job's rendezvous store, set once it exists)."""

    job_id: str
    sockets: list[str]
    rank: int
    wall_timeout_s: float
    # The job's bound on lateness, emulated seconds (its timeout_s, --timeout-s); the
    # process group's timeout bounds it too, whichever is shorter.
    late_s: float = float("inf")
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)  # files torch.save wrote, resolved
    steps: int = 0  # optimizer steps so far
    store: Store | None = None
    # Why the rank was stopped, if it was (script_thread.py): a wait at the store ends.
    stopped: Callable[[], str | None] = lambda: None
    _exchanges: int = 0
    _previous_key: str = ""  # this rank's key of the last exchange, deleted at the next
    _bucket_seen: bool = False  # this step's first gradient all-reduce came
    _samples_checked: bool = False

    # ------------------------------------------------------------ errors

    def group_made(self, size: int, rank: int) -> None:
        """init_process_group made the default group of `size` with this rank `rank`."""
        n = len(self.sockets)
        if size > n:
            raise ScriptMistake(
                TWO_PROCESSES_PER_SOCKET,
                f"init_process_group(world_size={size}) on a job of {n} sockets would put "
                f"two processes on one socket; each rank needs a socket of its own: submit "
                f"with --world-size {size} or leave world_size to WORLD_SIZE",
            )
        if size != n:
            raise ScriptMistake(
                WRONG_WORLD_SIZE,
                f"init_process_group(world_size={size}) but the job runs {n} ranks: the "
                "others would wait for ranks that never come. Leave world_size to "
                "WORLD_SIZE (torchrun's and this job's)",
            )
        if rank != self.rank:
            raise ScriptMistake(
                WRONG_RANK,
                f"init_process_group(rank={rank}) in the process of rank {self.rank} "
                f"({self.sockets[self.rank]}): two processes would claim rank {rank}. "
                "Leave rank to RANK",
            )

    def gradient_bucket(self, array: np.ndarray, clock: EmulatedClock, timeout_s: float) -> None:
        """A step's gradient all-reduce is about to run with `array`: the first of the
        step checks lateness (raises); the first of the job, duplicate samples."""
        if self._bucket_seen or len(self.sockets) == 1:
            return
        self._bucket_seen = True
        arrived = self._exchange("arrival", np.array([clock.now_ns], dtype=np.int64))
        late = int(np.argmax(arrived))
        late_s = float(arrived[late] - arrived.min()) * 1e-9
        bound = min(timeout_s, self.late_s)
        if late_s > bound:
            whose = "the process group's" if timeout_s <= self.late_s else "the job's (--timeout-s)"
            raise ScriptMistake(
                STRAGGLER_TIMEOUT,
                f"rank {late} ({self.sockets[late]}) reached the gradient all-reduce of step "
                f"{self.steps + 1} {late_s:.6g} emulated s after the first rank; {whose} "
                f"timeout is {bound:.6g} s. Raise it above the slowest rank's lag, or find "
                "why that socket is slow",
            )
        if not self._samples_checked:
            self._samples_checked = True
            digests = self._digests("gradients", [array])
            if all(d == digests[0] for d in digests[1:]):
                self._diagnose(
                    DUPLICATE_SAMPLES,
                    f"all {len(self.sockets)} ranks reduced the same gradients at the first "
                    "step: every rank read the same samples. Give the data loader a "
                    "DistributedSampler (and call set_epoch each epoch)",
                )

    def before_step(self, parameters: Iterable[torch.Tensor]) -> None:
        """An optimizer is about to step on `parameters`: at the first, do the replicas
        agree?"""
        if self.steps == 0 and len(self.sockets) > 1:
            digests = self._digests("parameters", [p.detach().numpy() for p in parameters])
            differ = [r for r, d in enumerate(digests) if d != digests[0]]
            if differ:
                self._diagnose(
                    REPLICAS_DIFFER,
                    f"at the first step, ranks {_ranks(differ)} hold other parameters than "
                    "rank 0: the replicas started apart and will not agree. Let DDP "
                    "broadcast rank 0's parameters (init_sync=True, its default), or "
                    "broadcast them yourself before training",
                )

    def after_step(self) -> None:
        self.steps += 1
        self._bucket_seen = False

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Optimizer steps and torch.save calls, watched while the script runs."""

        def before(optimizer: torch.optim.Optimizer, *_: Any) -> None:
            self.before_step(p for g in optimizer.param_groups for p in g["params"])

        hooks = [
            register_optimizer_step_pre_hook(before),
            register_optimizer_step_post_hook(lambda *_: self.after_step()),
        ]
        save = torch.save

        def saving(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(f, str | os.PathLike):
                self.saved.append(str(Path(f).resolve()))
            save(obj, f, *args, **kwargs)

        torch.save = saving  # scripts call torch.save by its module's name
        try:
            yield
        finally:
            torch.save = save
            for h in hooks:
                h.remove()

    # ------------------------------------------------------------ comparing notes

    def _diagnose(self, code: str, message: str) -> None:
        self.diagnostics.append({"code": code, "message": message, "step": self.steps})

    def _digests(self, what: str, arrays: list[np.ndarray]) -> list[bytes]:
        h = hashlib.blake2b(digest_size=16)
        for a in arrays:
            h.update(np.ascontiguousarray(a).tobytes())
        mine = np.frombuffer(h.digest(), dtype=np.uint8).copy()
        out = self._exchange(what, mine)
        return [bytes(part) for part in out.reshape(len(self.sockets), -1)]

    def _exchange(self, what: str, data: np.ndarray) -> np.ndarray:
        """Every rank's `data` (one shape and dtype on all), by rank, through the store."""
        store = self.store
        assert store is not None, "the job's rendezvous store is set before a script runs"
        self._exchanges += 1
        prefix = f"rdurack/{self.job_id}/check/{self._exchanges}/{what}"
        keys = [f"{prefix}/{r}" for r in range(len(self.sockets))]
        raw = np.ascontiguousarray(data).tobytes()
        store.set(keys[self.rank], raw)  # type: ignore[arg-type]  # stubs: str; bytes work
        self._wait(store, keys, what)
        parts = store.multi_get(keys)
        # Every rank has read the last exchange's keys before it wrote this one's.
        if self._previous_key:
            store.delete_key(self._previous_key)
        self._previous_key = keys[self.rank]
        return np.concatenate([np.frombuffer(p, dtype=data.dtype) for p in parts])

    def _wait(self, store: Store, keys: list[str], what: str) -> None:
        """Until every rank has written its key, the rank is stopped, or
        `wall_timeout_s` passes (then: which ranks never came)."""
        deadline = time.monotonic() + self.wall_timeout_s
        while True:
            try:
                store.wait(keys, timedelta(seconds=WAIT_SLICE_S))
                return
            except dist.DistStoreError:
                pass  # not all there yet
            reason = self.stopped()
            if reason is not None:
                raise RdurackError(f"stopped while comparing {what} with the other ranks: {reason}")
            if time.monotonic() >= deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise LinkFailure(
                    f"comparing {what}: rank(s) {_ranks(missing)} never arrived within "
                    f"{self.wall_timeout_s:g} s (wall_timeout_s)"
                )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]} to {ranks[-1]}"
