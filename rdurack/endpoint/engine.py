"""One model's serving engine: requests from many clients batched on its sockets.

The engine runs the stream scheduler (workloads/serving/stream/scheduler.py) as the
predictor's replay does, but on live requests: an asyncio task takes the next
iteration, has its executor run it (which says how long it took, in emulated seconds),
and hands each request the tokens the iteration produced.

Two clocks. The engine's emulated clock advances by each iteration. At `time_scale` s
> 0 the engine waits until wall time reaches the iteration's emulated end x s (from the
engine's start), so a token leaves at its emulated time (x s); a request's emulated
arrival is when the server received it / s. At 0 it runs as fast as the machine allows,
and a request arrives at the emulated clock's current time. While requests run or wait,
each iteration starts where the last one ended (the wall's lateness, a timer waking a
millisecond late, never adds to emulated time); an idle engine's next one starts at the
next arrival. A request joins the queue at the first iteration that starts after its
arrival, and one received while an iteration was being chosen arrives just after that
choice: the predictor's replay of the arrivals the engine recorded gives its times.

An executor whose calls cost wall time (a rack's sockets, endpoint/rack.py) may get
several iterations a call: when its last call took longer than the next iteration
lasts, the engine plans as many as that call spans with the pricer's times (the same
timing model the sockets run), and the sockets' answer times them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from rdurack.errors import RdurackError
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.pricing import Pass, Pricer
from rdurack.workloads.serving.stream.scheduler import Iteration, Running, Scheduler

# What an executor does with iterations' passes (pricing.py `Pass`, taken when each
# was chosen), back to back from the first one's emulated start (s since the engine
# started): run them, and say each one's emulated seconds; Unavailable if it cannot.
Executor = Callable[[Sequence[Pass], float], Awaitable[list[float]]]
MAX_AHEAD = 32  # iterations a call carries at most

# After an iteration the rack could not run, new requests are refused for this long
# (wall s) before the next one tries the rack again: a client retrying at once is told
# 503 at once, rather than each finding out after a call to the rack.
UNAVAILABLE_FOR_S = 1.0


class Unavailable(RdurackError):
    """The sockets could not run an iteration (a socket failed, the rack is down): its
    requests, and the waiting ones, end with this; `retry_after_s` (wall)."""

    def __init__(self, message: str, retry_after_s: float = UNAVAILABLE_FOR_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(RdurackError):
    """The engine's queue holds its bound of waiting requests; `retry_after_s` (wall)
    is about one iteration."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Token:
    """An output token: its index in the request's output and when it left (emulated)."""

    index: int
    emulated_s: float


@dataclass(eq=False)
class Handle:
    """A request in the engine: its tokens arrive on `tokens`, then None."""

    arrival: Arrival
    tokens: asyncio.Queue[Token | None] = field(default_factory=asyncio.Queue)
    sent: int = 0  # tokens put on the queue
    batches: list[int] = field(default_factory=list)  # the batch of each iteration it ran in
    admitted_s: float | None = None
    last_s: float = 0.0  # its last token's emulated time
    done: bool = False
    error: Unavailable | None = None  # why it ended before its last token


class Engine:
    """The batching loop of one model on its sockets."""

    def __init__(
        self,
        model: str,
        scheduler: Scheduler,
        pricer: Pricer,
        executor: Executor,
        time_scale: float = 1.0,
        max_waiting: int = 256,
        plans_ahead: bool = False,
    ) -> None:
        """`pricer`: what each iteration's pass is. `plans_ahead`: the executor's calls
        cost wall time (a rack); at `time_scale` > 0 a call then carries as many
        iterations as its last call's wall time spans (at most MAX_AHEAD), planned with
        the pricer's times and timed by the executor."""
        if time_scale < 0:
            raise ValueError(f"time scale must be >= 0, got {time_scale}")
        self.model = model
        self.scheduler = scheduler
        self.executor = executor
        self.time_scale = time_scale
        self.max_waiting = max_waiting
        self.clock_s = 0.0  # emulated seconds since the engine started
        self.iteration_s = 0.0  # the last iteration's emulated duration (a retry hint)
        self._wall0 = time.monotonic()
        self._handles: dict[int, Handle] = {}
        self._next = 0
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._down: tuple[Unavailable, float] | None = None  # the last failure, wall time
        # Requests received whose emulated arrival the clock has not reached yet: they
        # join the scheduler's queue at the first iteration that starts after it.
        self._pending: list[Arrival] = []
        self._decided_s = -1.0  # the start of the last iteration chosen, emulated s
        self.pricer = pricer
        self.plans_ahead = plans_ahead
        self._call_wall_s = 0.0  # the executor's last call, wall s
        # A plan's iterations as the scheduler finished them: their requests that
        # finished, and their estimated (start, end), emulated s.
        self._finished: list[list[Running]] = []
        self._estimated: list[tuple[float, float]] = []
        self.on_token: Callable[[Handle, Token], None] = lambda h, t: None
        self.on_done: Callable[[Handle, Running | None], None] = lambda h, r: None
        # Tracing's (endpoint/tracing.py): a request queued; what a call of the planned
        # iterations runs in (its trace context); an iteration that ran, (start, end).
        self.on_submit: Callable[[Handle], None] = lambda h: None
        self.on_call: Callable[[Sequence[Iteration]], AbstractContextManager[object]] = (
            lambda planned: contextlib.nullcontext()
        )
        self.on_iteration: Callable[[Iteration, float, float], None] = lambda it, s, e: None

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._wall0 = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for h in list(self._handles.values()):
            self._close(h, None)

    # ------------------------------------------------------------------ requests

    def now(self) -> float:
        """The emulated time a request arriving now gets."""
        if self.time_scale == 0:
            return self.clock_s
        return max(self.clock_s, (time.monotonic() - self._wall0) / self.time_scale)

    def submit(
        self,
        prompt_tokens: int,
        output_tokens: int,
        received: float | None = None,
        expert: str = "",
        routed: bool = False,
    ) -> Handle:
        """Queue a request; Refused if it could never fit, QueueFull at the bound.
        `received`: when the server got it (time.monotonic()), so that parsing it is not
        counted as emulated waiting; default now. Of a bundle: its `expert`, and
        whether the router chose it (`routed`)."""
        if self._down is not None:
            failure, since = self._down
            if time.monotonic() - since < UNAVAILABLE_FOR_S:
                raise Unavailable(str(failure), UNAVAILABLE_FOR_S)
            self._down = None  # the next iteration tries the sockets again
        if self.waiting >= self.max_waiting:
            raise QueueFull(
                f"{self.model}: {self.waiting} requests are waiting, the bound; retry later",
                self.iteration_s * self.time_scale,
            )
        at = self.now()
        if received is not None and self.time_scale > 0:
            at = (received - self._wall0) / self.time_scale
        # The iteration chosen from `_decided_s` could not have taken it (the engine
        # chose while the server parsed it): it arrives just after, as the predictor's
        # replay, which admits what arrived by each start, would have it.
        at = max(at, math.nextafter(self._decided_s, math.inf))
        arrival = Arrival(self._next, at, prompt_tokens, output_tokens, expert, routed)
        self.scheduler.refuse(arrival)  # before anything is held
        self._pending.append(arrival)
        self._next += 1
        handle = Handle(arrival)
        self._handles[arrival.index] = handle
        self._work.set()
        self.on_submit(handle)
        return handle

    def cancel(self, handle: Handle) -> None:
        """The client is gone or has what it wanted: free its slot and KV cache now."""
        if not handle.done:
            self._forget(handle.arrival)
            self._close(handle, None)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._pending)

    def _forget(self, a: Arrival) -> None:
        if a in self._pending:
            self._pending.remove(a)
        else:
            self.scheduler.drop(a.index)

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        while True:
            start = self._start()
            it = None if start is None else self._choose(start)
            if start is None or it is None:
                self._work.clear()
                await self._work.wait()
                continue
            planned, passes = [it], [self.pricer.pass_of(it)]
            if (ahead := self._ahead(passes[0])) > 1:
                self._plan(planned, passes, start, ahead)
            try:
                wall = time.monotonic()
                with self.on_call(planned):
                    durations = await self.executor(passes, start)
                self._call_wall_s = time.monotonic() - wall
            except Unavailable as e:
                self._fail(e)
                continue
            await self._run(planned, start, durations, ahead > 1)

    def _choose(self, start: float) -> Iteration | None:
        """The iteration starting at `start`, with the arrivals it can take."""
        for a in sorted((a for a in self._pending if a.at_s <= start), key=_at):
            self._pending.remove(a)
            self.scheduler.arrive(a)
        it = self.scheduler.next(start)
        if it is not None:
            self._decided_s = start
            for r, _ in it.prefill:
                h = self._handles.get(r.arrival.index)
                if h is not None and h.admitted_s is None:
                    h.admitted_s = r.admitted_s
        return it

    def _ahead(self, first: Pass) -> int:
        """How many iterations the next call carries: one, unless its wall time would
        make the tokens late (the last call took longer than this iteration lasts)."""
        if not self.plans_ahead or self.time_scale == 0 or self._call_wall_s == 0:
            return 1
        lasts = self.pricer.seconds(first) * self.time_scale
        return max(1, min(MAX_AHEAD, math.ceil(self._call_wall_s / lasts))) if lasts > 0 else 1

    def _plan(self, planned: list[Iteration], passes: list[Pass], start: float, ahead: int) -> None:
        """Up to `ahead` iterations back to back from the first of `planned`, each
        finished on the scheduler at its end by the pricer (`_run` puts the executor's
        times in), and each one's pass taken before it is finished."""
        at = start
        while True:
            end = at + self.pricer.seconds(passes[-1])
            self._estimated.append((at, end))
            self._finished.append(self.scheduler.finish(planned[-1], end))
            at = end
            if len(planned) == ahead or not self.scheduler.busy:
                return
            it = self._choose(at)
            if it is None:
                return
            planned.append(it)
            passes.append(self.pricer.pass_of(it))

    async def _run(
        self, planned: list[Iteration], start: float, durations: list[float], done: bool
    ) -> None:
        """Each iteration in turn: paced to its end, its tokens out, its finished
        requests closed. `done`: the plan already finished them on the scheduler at
        estimated ends, which the executor's times now replace."""
        ends = list(itertools.accumulate(durations, initial=start))[1:]
        finished, estimated = self._finished, self._estimated
        self._finished, self._estimated = [], []
        for i, it in enumerate(planned):
            self.iteration_s = durations[i]
            if done:
                _retime(it, estimated[i], (ends[i - 1] if i else start, ends[i]))
            await self._pace(ends[i])
            self.clock_s = ends[i]
            closed = finished[i] if done else self.scheduler.finish(it, ends[i])
            self._deliver(it, ends[i])
            self.on_iteration(it, ends[i - 1] if i else start, ends[i])
            for r in closed:
                h = self._handles.get(r.arrival.index)
                if h is not None:
                    self._close(h, r)

    def _start(self) -> float | None:
        """When the next iteration starts (emulated s): where the last one ended while
        requests run or wait, so that the wall's lateness never adds to emulated time;
        else at the first pending arrival; None when there is nothing to do."""
        if self.scheduler.busy:
            return self.clock_s
        if self._pending:
            return max(self.clock_s, min(a.at_s for a in self._pending))
        return None

    async def _pace(self, end_s: float) -> None:
        """Wait for the wall clock to reach the iteration's end; at time scale 0 (or when
        late) just let the event loop serve requests before the next iteration."""
        delay = self._wall0 + end_s * self.time_scale - time.monotonic()
        await asyncio.sleep(delay if self.time_scale > 0 and delay > 0 else 0)

    def _deliver(self, it: Iteration, end_s: float) -> None:
        """The tokens the iteration ending at `end_s` produced, out now: of a plan's
        iterations, finished on the scheduler ahead, each waits for its own (their
        tokens are stamped with their iteration's end, `_retime`)."""
        members = [r for r, _ in it.prefill] + list(it.decode)
        for r in members:
            h = self._handles.get(r.arrival.index)
            if h is None:
                continue
            h.batches.append(it.batch)
            while h.sent < len(r.token_s) and r.token_s[h.sent] == end_s:
                token = Token(h.sent, r.token_s[h.sent])
                h.sent += 1
                h.tokens.put_nowait(token)
                self.on_token(h, token)

    def _fail(self, e: Unavailable) -> None:
        """The sockets could not run an iteration: every request ends with `e`, its slot
        and KV cache freed, and new ones are refused for a while."""
        self._down = (e, time.monotonic())
        self._finished, self._estimated = [], []  # a plan that did not run
        for h in list(self._handles.values()):
            self._forget(h.arrival)
            h.error = e
            self._close(h, None)

    def _close(self, h: Handle, r: Running | None) -> None:
        if h.done:
            return
        h.done = True
        self._handles.pop(h.arrival.index, None)
        h.tokens.put_nowait(None)
        self.on_done(h, r)


def _at(a: Arrival) -> float:
    return a.at_s


def _retime(it: Iteration, estimated: tuple[float, float], ran: tuple[float, float]) -> None:
    """A planned iteration's requests, finished at its estimated (start, end), get the
    times the executor measured instead (the same unless a socket is slowed)."""
    if estimated == ran:
        return
    for r in (*(r for r, _ in it.prefill), *it.decode):
        r.token_s[:] = [ran[1] if t == estimated[1] else t for t in r.token_s]
        if r.admitted_s == estimated[0]:
            r.admitted_s = ran[0]
