"""Functional generation on a socket: a program's Generate op (workloads/program.py)
computed by a tiny expert (workloads/tiny_lm/), this socket's TP shard of it, with
real ring all-reduces over the socket's links.

Those all-reduces run on a scratch clock and scratch link busy times: the Kernel ops
beside a Generate op carry its emulated time (as in timing mode), so a functional
program takes the time a timing one does.
"""

from __future__ import annotations

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.node_agent.collective_engine import CollectiveEngine
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.topology import SocketId
from rdurack.workloads.coe.bundle import BundleShare
from rdurack.workloads.program import Generate
from rdurack.workloads.tiny_lm.generation import generate
from rdurack.workloads.tiny_lm.model import TinyLM, TinyLMConfig, TinyLMShard


class TinyExperts:
    """One job's tiny experts on socket `me`, rank of the TP `group` (socket ids, rank
    order), over `engine`'s links; `clock`: the socket's."""

    def __init__(
        self,
        job_id: str,
        me: str,
        group: list[str],
        engine: CollectiveEngine,
        clock: EmulatedClock,
    ) -> None:
        self._members = [SocketId.parse(g) for g in group]
        self._rank, self._size = group.index(me), len(group)  # its shard of each expert
        self._shards: dict[str, TinyLMShard] = {}  # expert -> this socket's shard
        self._engine, self._clock = engine, clock
        self._tags = f"{job_id}/generate"  # and a count: the same on every rank
        self._calls = 0  # all-reduces so far

    def generate(self, op: Generate, share: BundleShare, timeout_s: float) -> tuple[int, ...]:
        """Greedy generation by `op`'s expert, whose seed the bundle `share` holds;
        each all-reduce waits at most `timeout_s` wall seconds for a peer."""
        if op.expert not in self._shards:
            experts = share.op.experts
            if op.expert not in experts or len(share.op.expert_seeds) != len(experts):
                raise InvalidRequest(
                    f"generate: expert {op.expert!r} has no functional weights in this bundle"
                )
            seed = share.op.expert_seeds[experts.index(op.expert)]
            model = TinyLM(TinyLMConfig(), seed)
            self._shards[op.expert] = model.shard(self._rank, self._size)
        scratch = EmulatedClock(self._clock.now_ns)

        def all_reduce(partial: np.ndarray) -> np.ndarray:
            # Ring: every rank gets bitwise the same sum, so their argmaxes agree.
            buffer = np.array(partial, dtype=np.float64, copy=True).reshape(-1)
            self._calls += 1
            tag = f"{self._tags}/{self._calls}"
            engine = self._engine.scratch()
            engine.run(
                tag, engine.plan("all_reduce", self._members, buffer), scratch, timeout_s, buffer
            )
            return buffer.reshape(partial.shape)

        tokens = generate(self._shards[op.expert], op.prompt, op.max_new_tokens, all_reduce)
        return tuple(tokens)
