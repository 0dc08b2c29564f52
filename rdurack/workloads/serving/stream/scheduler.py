"""Which requests run in each iteration of a model's sockets: the batching policies.

An *iteration* is one pass over the model: the prefill of some prompts, one decode step
of every running request, or (chunked prefill) decode steps and chunks of prompts
together. The scheduler decides what the next one holds; whoever
drives it (`replay` in the predictor, the endpoint on the socket actors) prices or runs
it and says when it ended. It knows no clock of its own and no timing model.

Policies:
- `static` (the paper's setting): when nothing runs, up to `max_batch` waiting requests
  start together; the batch prefills, then decodes until its longest request is done.
  A request that is done early keeps its slot (padding: its row is still computed, as a
  fixed batch is) and nothing joins until the batch ends.
- `continuous` (iteration-level, as vLLM schedules): at every iteration, waiting
  requests join while a slot and their KV cache are free. An iteration that admits
  requests prefills them alone (their prompts, whole); the others' decode waits for it
  (vLLM's default without chunked prefill). A done request leaves at once.
- `chunked-prefill` (as Sarathi-Serve): every iteration holds at most `chunk_tokens`
  new tokens: one for each running request's decode step first, then chunks of the
  prompts being prefilled (first come, first served), then of newly admitted ones. A
  prompt's last chunk yields its first token. Decodes never wait for a whole prompt.

Experts (a CoE bundle: serving/stream/bundle.py): a batch is one expert's, since
experts do not share weights. When nothing runs, the head of the queue picks the expert,
and every waiting request of that expert is admitted (in order, as slots and KV cache
allow); while it runs, a request joins only from the head of the queue, so once a
request of another expert waits the batch drains and that expert is next (first come,
first served between experts; no expert waits behind a busy one for long). An
iteration whose expert is not in the HBM region first switches it in (`switch`). A
model that is not a bundle has one expert, "", and is batched as above.

Admission reserves a request's whole KV cache (prompt and output tokens) when it
starts, so a running request never runs out of HBM and nothing is preempted; a request
waits (first come, first served) while its cache does not fit beside the running ones,
and one that could never fit, alone on the sockets, is refused at arrival with the
numbers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from enum import StrEnum

from rdurack.errors import InvalidRequest
from rdurack.rack.residency import ResidencyManager
from rdurack.workloads.serving.stream.arrivals import Arrival


class Policy(StrEnum):
    STATIC = "static"
    CONTINUOUS = "continuous"
    CHUNKED = "chunked-prefill"


# Assumption: 512 new tokens per chunked-prefill iteration, the smaller of the two token
# budgets Sarathi-Serve evaluates (512 and 2048); set it with --chunk-tokens.
DEFAULT_CHUNK_TOKENS = 512


@dataclass(eq=False)
class Running:
    """A request admitted to the sockets: what it has done and when (emulated s)."""

    arrival: Arrival
    admitted_s: float
    prefilled: int = 0  # prompt tokens processed
    generated: int = 0  # output tokens produced (the prefill yields the first)
    token_s: list[float] = field(default_factory=list)  # when each output token was out

    @property
    def kv_tokens(self) -> int:
        """The KV cache it reserves: its whole prompt and output."""
        return self.arrival.prompt_tokens + self.arrival.output_tokens

    @property
    def context(self) -> int:
        """Tokens its next decode step attends to: the prompt, what it generated."""
        return self.arrival.prompt_tokens + self.generated

    @property
    def decoding(self) -> bool:
        """Its prompt is prefilled and it has tokens left to generate."""
        return self.prefilled == self.arrival.prompt_tokens and not self.done

    @property
    def done(self) -> bool:
        return self.generated >= self.arrival.output_tokens


@dataclass(frozen=True)
class Iteration:
    """One pass over the model: the prompt tokens it prefills (a request and how many
    of its prompt's tokens, from its `prefilled`), the requests it decodes one token
    for, and static batching's done requests, computed all the same (`padding`); of a
    bundle, the expert it runs and whether it first switches it into HBM."""

    prefill: tuple[tuple[Running, int], ...] = ()
    decode: tuple[Running, ...] = ()
    padding: tuple[Running, ...] = ()
    expert: str = ""
    switch: bool = False

    @property
    def batch(self) -> int:
        return len(self.prefill) + len(self.decode) + len(self.padding)


class Refused(InvalidRequest):
    """A request that could never run: its KV cache alone exceeds the budget."""


class Scheduler:
    """The queue and the running batch of one model on its sockets."""

    def __init__(
        self,
        policy: Policy,
        max_batch: int,
        kv_budget_tokens: int,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        region: ResidencyManager | None = None,
        context: int | None = None,
    ) -> None:
        """`kv_budget_tokens`: the KV-cache tokens the sockets hold beside the weights;
        `chunk_tokens`: a chunked-prefill iteration's new tokens, at most; `region`: a
        bundle's experts in HBM (None: one model, always there); `context`: the tokens a
        request may have, prompt and output (None: as many as the KV budget holds)."""
        if max_batch <= 0 or chunk_tokens <= 0:
            raise InvalidRequest(
                f"max batch and chunk tokens must be positive, got {max_batch}, {chunk_tokens}"
            )
        self.chunk_tokens = chunk_tokens
        if kv_budget_tokens <= 0:
            raise InvalidRequest("the model leaves no HBM for a KV cache on these sockets")
        self.policy = policy
        self.region = region
        self.context = context
        self.switches = 0  # iterations that switched an expert in
        self.max_batch = max_batch
        self.kv_budget_tokens = kv_budget_tokens
        self.waiting: deque[Arrival] = deque()
        self.running: list[Running] = []

    @property
    def reserved_tokens(self) -> int:
        return sum(r.kv_tokens for r in self.running)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def arrive(self, a: Arrival) -> None:
        """Queue a request, or refuse one that could never fit."""
        self.refuse(a)
        self.waiting.append(a)

    def refuse(self, a: Arrival) -> None:
        """Refused if the request could never fit, whatever else runs."""
        need = a.prompt_tokens + a.output_tokens
        if self.context is not None and need > self.context:
            raise Refused(
                f"request {a.index}: {a.prompt_tokens} prompt + {a.output_tokens} output = "
                f"{need} tokens exceed the model's context window of {self.context} tokens"
            )
        if need > self.kv_budget_tokens:
            raise Refused(
                f"request {a.index}: its KV cache ({a.prompt_tokens} prompt + "
                f"{a.output_tokens} output = {need} tokens) exceeds what the sockets hold "
                f"beside the weights ({self.kv_budget_tokens} tokens)"
            )

    def next(self, now_s: float) -> Iteration | None:
        """The next iteration from `now_s`, admitting what the policy lets in; None when
        nothing can run (no request, or every waiting one blocked on memory while
        nothing runs, which `arrive` rules out)."""
        it = self._next(now_s)
        if it is None or not self.running:
            return it
        expert = self.running[0].arrival.expert  # the batch's, one expert
        if self.region is None:
            return replace(it, expert=expert)
        switch = not self.region.ensure(expert).hit
        self.switches += switch
        return replace(it, expert=expert, switch=switch)

    def _next(self, now_s: float) -> Iteration | None:
        if self.policy is Policy.CHUNKED:
            return self._chunked(now_s)
        if self.policy is Policy.STATIC and self.running:
            live = tuple(r for r in self.running if not r.done)
            return Iteration(decode=live, padding=tuple(r for r in self.running if r.done))
        admitted = self._admit(now_s)
        if admitted:
            return Iteration(prefill=tuple((r, r.arrival.prompt_tokens) for r in admitted))
        return Iteration(decode=tuple(self.running)) if self.running else None

    def _chunked(self, now_s: float) -> Iteration | None:
        """Decode steps first, then chunks of prompts under way, then of new ones."""
        gather = not self.running
        decode = tuple(r for r in self.running if r.decoding)
        budget = self.chunk_tokens - len(decode)
        chunks: list[tuple[Running, int]] = []
        for under_way in [r for r in self.running if not r.decoding and not r.done]:
            if budget <= 0:
                break
            n = min(under_way.arrival.prompt_tokens - under_way.prefilled, budget)
            chunks.append((under_way, n))
            budget -= n
        while budget > 0 and (new := self._admit_one(now_s, gather)) is not None:
            n = min(new.arrival.prompt_tokens, budget)
            chunks.append((new, n))
            budget -= n
        if not decode and not chunks:
            return None
        return Iteration(prefill=tuple(chunks), decode=decode)

    def _admit(self, now_s: float) -> list[Running]:
        """Every waiting request that can start now, first come first served."""
        gather = not self.running
        admitted: list[Running] = []
        while (r := self._admit_one(now_s, gather)) is not None:
            admitted.append(r)
        return admitted

    def _admit_one(self, now_s: float, gather: bool) -> Running | None:
        """The next request of the batch's expert, started, if a slot and its KV cache
        are free: the head of the queue, or (`gather`: the batch starts in this
        iteration) the first waiting request of the head's expert."""
        if not self.waiting or len(self.running) >= self.max_batch:
            return None
        head = self.waiting[0]
        pick: Arrival | None = head
        if self.running:
            expert = self.running[0].arrival.expert
            if gather:
                pick = next((a for a in self.waiting if a.expert == expert), None)
            elif head.expert != expert:
                pick = None
        if pick is None:
            return None
        if pick.prompt_tokens + pick.output_tokens > self.kv_budget_tokens - self.reserved_tokens:
            return None
        if pick is head:
            self.waiting.popleft()
        else:
            self.waiting.remove(pick)
        r = Running(pick, now_s)
        self.running.append(r)
        return r

    def drop(self, index: int) -> bool:
        """Take request `index` out, waiting or running (a client gone, a stop sequence
        met): its slot and KV cache are free for the next iteration. False if absent."""
        for a in self.waiting:
            if a.index == index:
                self.waiting.remove(a)
                return True
        kept = [r for r in self.running if r.arrival.index != index]
        dropped = len(kept) < len(self.running)
        self.running = kept
        return dropped

    def finish(self, it: Iteration, end_s: float) -> list[Running]:
        """The iteration ended at `end_s`: each of its requests has one more token. The
        requests it finished (continuous: they leave now; static: with the batch)."""
        for r, n in it.prefill:
            r.prefilled += n
            if r.prefilled == r.arrival.prompt_tokens:  # its last chunk: the first token
                r.generated += 1
                r.token_s.append(end_s)
        for r in it.decode:
            r.generated += 1
            r.token_s.append(end_s)
        if self.policy is Policy.STATIC:
            if all(r.done for r in self.running):
                done, self.running = self.running, []
                return done
            return []
        done = [r for r in self.running if r.done]
        self.running = [r for r in self.running if not r.done]
        return done
