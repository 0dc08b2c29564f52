"""A script rank's emulated time: what its tensors' operations and collectives take on
the socket, as torch on the hardware would spend it.

Compute: every aten operator the script runs (forward, backward, optimizer) goes into
the socket's kernels as it runs (script_kernels.py: each its own kernel, unfused, or
fused with its neighbours up to the next sync point), and each kernel's time onto the
compute stream when it ends. FLOPs are what torch's `FlopCounterMode` counts
(matmul-class operators: mm, addmm, bmm, convolutions, attention); bytes are the
operators' tensors. Views (transpose, reshape, detach) move nothing and launch nothing.

Streams, as torch DDP on a GPU: a gradient all-reduce issued during backward (DDP's
bucket hooks) runs on a communication stream from when it is issued (or when the
previous one ends), beside backward's compute; the compute stream waits for it at the
first operator after backward (DDP's reducer waits for its buckets there) or at the
next optimizer step or collective, and that wait is the all-reduce backward did not
hide. Other collectives run on the compute stream.

Steps are the optimizer's steps (a global post-step hook counts them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.hooks import RemovableHandle

from rdurack.errors import RdurackError
from rdurack.node_agent.training.script_kernels import Kernels
from rdurack.node_agent.training.script_memory import TensorMemory
from rdurack.node_agent.training.spans import MAX_TRACED_STEPS, GradientWindow, SentAndReceived
from rdurack.rack.clock import EmulatedClock


class ScriptStopped(RdurackError):
    """Raised inside a rank's script, at its next operator, when the job stops it."""


def in_backward() -> bool:
    """Whether the calling thread runs an autograd backward now."""
    return bool(torch._C._current_graph_task_id() != -1)


class Streams:
    """A rank's compute stream (the socket's `clock`) and communication stream."""

    def __init__(
        self,
        clock: EmulatedClock,
        kernels: Kernels,
        slowdown: Callable[[], float] = lambda: 1.0,
    ) -> None:
        """`kernels`: how operators become kernels and what they take; `slowdown`: how
        many times longer the socket's compute takes now (a fault; read at each kernel)."""
        self.clock = clock
        self.kernels = kernels
        self._slowdown = slowdown
        self.comm_free_ns = clock.now_ns  # when the communication stream is free
        self.compute_ns = 0  # operators' time on the compute stream
        self.all_reduce_ns = 0  # all-reduce time, both streams
        self.exposed_ns = 0  # ... the part the compute stream waited for
        self.flops = 0.0
        self.operators = 0
        self.step_ends_ns: list[int] = []  # compute stream at each optimizer step's end
        # Steps not yet taken by the rank's recorder (runner.py), with their gradients'
        # all-reduce; None past the first MAX_TRACED_STEPS (a script's total is its own,
        # so its steps are not spread over the run as the built-in loop's are).
        self.records: list[StepRecord | None] = []
        self._window: GradientWindow | None = None  # this step's gradient all-reduce
        self._began_ns = clock.now_ns  # when this step began: the last one's end
        self._paused = 0  # inside a collective: its tensor copies are not compute
        self.on_step: Callable[[], None] = lambda: None  # told after each optimizer step
        # Set (from another thread) to stop the script: its next operator raises.
        self.stop_reason: str | None = None

    def operator(
        self, flops: float, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> None:
        """One operator ran: into the kernels, and the time of any that ended on the
        compute stream."""
        if self.stop_reason is not None:
            raise ScriptStopped(self.stop_reason)
        if self._paused:
            return
        if not in_backward():
            self.settle()
        self._compute(self.kernels.add(flops, inputs, outputs))
        self.flops += flops
        self.operators += 1

    def flush(self) -> None:
        """A sync point: the open kernel ends."""
        self._compute(self.kernels.flush())

    def _compute(self, seconds: float) -> None:
        began = self.clock.now_ns
        self.clock.advance(seconds * self._slowdown())
        self.compute_ns += self.clock.now_ns - began

    def settle(self) -> None:
        """The compute stream waits for the communication stream."""
        now = self.clock.now_ns
        if self.comm_free_ns > now:
            self.exposed_ns += self.comm_free_ns - now
            self.clock.advance_to(self.comm_free_ns)

    @contextlib.contextmanager
    def collective(self, op: str) -> Iterator[EmulatedClock]:
        """The clock a collective `op` runs on: a gradient all-reduce issued in backward
        on the communication stream, the rest on the compute stream after it."""
        self.flush()  # what ran before the collective has ended
        self._paused += 1
        try:
            if op == "all_reduce" and in_backward():
                stream = EmulatedClock(max(self.comm_free_ns, self.clock.now_ns))
                began = stream.now_ns
                yield stream
                self.comm_free_ns = stream.now_ns
                self.all_reduce_ns += stream.now_ns - began
            else:
                self.settle()
                began = self.clock.now_ns
                yield self.clock
                if op == "all_reduce":
                    self.all_reduce_ns += self.clock.now_ns - began
                    self.exposed_ns += self.clock.now_ns - began
        finally:
            self._paused -= 1

    @property
    def busy(self) -> bool:
        """Inside a collective (its operators are not the script's)."""
        return self._paused > 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Operators run here are not the script's compute (a collective's copies)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def step_began(self) -> None:
        """An optimizer step begins: it reads every gradient."""
        self.flush()
        self.settle()

    def step_ended(self) -> None:
        self.flush()
        now = self.clock.now_ns
        self.step_ends_ns.append(now)
        # The rank's recorder takes them (a list's append and its swap for a new one are
        # atomic under the GIL: the recorder runs on another thread).
        self.records.append(
            StepRecord(self.steps, self._began_ns, now, self._window, self.exposed_ns)
            if self.steps <= MAX_TRACED_STEPS
            else None
        )
        self._began_ns, self._window = now, None
        self.on_step()

    def gradients(self, start_ns: int, end_ns: int, nbytes: int, traffic: SentAndReceived) -> None:
        """A gradient all-reduce ran on the communication stream (process_group.py):
        part of this step's window."""
        if self._window is None:
            self._window = GradientWindow(start_ns, end_ns)
        self._window.add(end_ns, nbytes, traffic)

    @property
    def steps(self) -> int:
        return len(self.step_ends_ns)

    def step_s(self) -> float:
        """Mean emulated seconds between optimizer steps, from the first step's end
        (warm-up and DDP's initial broadcast excluded); 0 with fewer than two steps."""
        ends = self.step_ends_ns
        return (ends[-1] - ends[0]) * 1e-9 / (len(ends) - 1) if len(ends) > 1 else 0.0


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of a script, emulated ns, for its span."""

    step: int  # from 1
    began_ns: int
    end_ns: int
    gradients: GradientWindow | None  # its all-reduce in backward, if any
    exposed_ns: int  # all the communication the compute stream waited for so far


class Pricing(FlopCounterMode):
    """torch's FLOP counter, each operator also priced on `streams` as it runs; and,
    given `memory`, the tensors it holds (script_memory.py) told when backward begins
    and ends, what autograd saves, and when an optimizer steps."""

    def __init__(self, streams: Streams, memory: TensorMemory | None = None) -> None:
        super().__init__(display=False)
        self.streams = streams
        self.memory = memory
        self._hooks: list[RemovableHandle] = []
        self._saving: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        self._backward = False

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)  # type: ignore[no-untyped-call]
        flops = self.get_total_flops() - before
        backward = in_backward()
        if backward != self._backward and not self.streams.busy:
            self._backward = backward
            self.streams.flush()  # forward's kernels end where backward's begin
            if self.memory is not None:
                if backward:
                    self.memory.forward_ended()
                else:
                    self.memory.backward_ended()
        if not flops and _is_view(func_packet):
            return result
        self.streams.operator(float(flops), _tensors((args, kwargs)), _tensors(out))
        return result

    def __enter__(self) -> Pricing:
        streams, memory = self.streams, self.memory

        def stepped(optimizer: torch.optim.Optimizer, *_: Any) -> None:
            streams.step_ended()
            if memory is not None:
                memory.stepped(optimizer)

        self._hooks = [
            register_optimizer_step_pre_hook(lambda *_: streams.step_began()),
            register_optimizer_step_post_hook(stepped),
        ]
        if memory is not None:
            self._saving = torch.autograd.graph.saved_tensors_hooks(memory.pack, lambda t: t)
            self._hooks.append(register_module_forward_pre_hook(memory.module_runs))
        self._saving.__enter__()
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        self._saving.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        self.streams.flush()
        self.streams.settle()


def _tensors(tree: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _is_view(packet: Any) -> bool:
    """Whether an operator returns a view of an input (it moves no data), by its
    schema: a return aliasing an input without writing it (in-place ops write)."""
    found = _VIEWS.get(packet)
    if found is None:
        overloads = packet.overloads() if hasattr(packet, "overloads") else []
        schema = getattr(packet, overloads[0])._schema if overloads else None
        found = schema is not None and any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        _VIEWS[packet] = found
    return found


# Operator packets -> whether they return views. A cache of facts about torch's own
# operators (the same for every job), filled as operators are first seen.
_VIEWS: dict[Any, bool] = {}
