"""Serving a Composition of Experts: batching, routing to replicas, per-expert programs.

PAPER Sec. VI-C: a batch's router runs once, then each (prompt, expert) pair runs in
turn; an expert not in HBM is first switched in from DDR. Requests of one batch that
share an expert form one group: one switch, one prefill, one (kernel-looped) decode.

The engine is a discrete-event loop over emulated time. Requests are dispatched to a
serving replica when they arrive; a replica that is free starts a batch of up to `batch_size`
requests that have arrived, runs it as one program on its TP group (NodeExecutor), and
is free again when the program ends. Its decisions use the emulated clocks the
executor reports, so on the cluster they are driven by the socket actors' own clocks.

A replica is one TP group (`tensor_parallel` sockets of one node; by default a whole
node, as in PAPER). With several replicas (both nodes serving), "cache-aware" routing
sends a request to a replica that holds its expert in HBM (or has it queued), unless
that replica's queue is a batch longer than the shortest; otherwise to the replica with
the shortest queue. "random" picks a replica at random: the baseline cache-aware
routing is measured against.

A replica whose program fails with ReplicaFailed (on the rack: one of its sockets or
its agent died) is dropped; its batch and its queue are re-routed to the replicas left,
keeping their arrival times, so their latency shows the loss. With no replica left the
job fails (ReplicaFailed, which the orchestrator retries by policy).

Times are emulated ns inside the engine and seconds in the report.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.workloads.coe.bundle import kv_tokens_bytes
from rdurack.workloads.coe.report import CoeOutOfMemory, CoeReport, ReplicaFailed, RequestResult
from rdurack.workloads.coe.spec import CoeRequest, CoeWorkload
from rdurack.workloads.predictor import Predictor, switch_time_s
from rdurack.workloads.program import Deploy, Generate, Kernel, Op, OpRun, ProgramRun, Switch


class NodeExecutor(Protocol):
    def run(self, replica: int, ops: Sequence[Op], start_ns: int) -> ProgramRun:
        """Run `ops` on the TP group of `replica` from `start_ns` (or the group's clock if
        later); the ProgramRun speaks for the group (each op ends when its last socket
        does)."""
        ...


@dataclass
class _Replica:
    index: int
    free_ns: int
    kv_pool_bytes: int = 0
    resident: set[int] = field(default_factory=set)
    queue: deque[CoeRequest] = field(default_factory=deque)
    queued: Counter[int] = field(default_factory=Counter)  # experts of the queue

    def expects(self, expert: int) -> bool:
        return expert in self.resident or self.queued[expert] > 0

    def push(self, r: CoeRequest) -> None:
        self.queue.append(r)
        self.queued[r.expert] += 1

    def pop(self) -> CoeRequest:
        r = self.queue.popleft()
        self.queued[r.expert] -= 1
        return r


@dataclass
class _Wave:
    requests: list[CoeRequest]
    prefill: int  # op index
    decode: int | None
    generate: list[int]


@dataclass
class _Group:
    expert: int
    switch: int  # op index
    waves: list[_Wave]


Progress = Callable[[int, int, int], None]  # (requests done, requests, emulated ns)


class CoeEngine:
    """Serves one job's requests on `replicas` through `executor`."""

    def __init__(
        self,
        w: CoeWorkload,
        platform: PlatformSpec,
        models: dict[str, ModelSpec],
        experts: list[str],
        executor: NodeExecutor,
        replicas: Sequence[int],
        *,
        functional: bool = False,
        start_ns: int = 0,
        progress: Progress | None = None,
    ) -> None:
        self.w = w
        self.platform = platform
        self.models = models
        self.names = experts
        self._index = {n: i for i, n in enumerate(experts)}
        self.executor = executor
        self.functional = functional
        self.start_ns = start_ns
        self.progress = progress
        self.predictor = Predictor(platform)
        self.expert = models[w.expert_model]
        self.router = models[w.router_model]
        self.decode_plan = w.decode_plan or self.predictor.default_decode_plan()
        # Prefill and the router are single passes: fused (HO) on SN40L, unfused on GPUs.
        self.prefill_plan = (
            FusionPlan.UNFUSED if self.decode_plan is FusionPlan.UNFUSED else FusionPlan.FUSED_HO
        )
        self.group = w.tensor_parallel or platform.node.sockets
        self._switch_s = switch_time_s(platform, self.expert.weight_bytes, self.group)
        self._replicas = [_Replica(n, start_ns) for n in replicas]
        self._rng = np.random.default_rng(w.seed)
        self._starved: list[tuple[int, int, int]] = []  # (group size, wave size, extra ns)
        self._router_ns = 0
        self._switches: list[tuple[str, OpRun]] = []  # (expert, its switch) on misses
        self._failed: list[tuple[_Replica, str, int]] = []  # (replica, why, requests moved)
        self._rerouted: set[int] = set()  # request indices

    # ------------------------------------------------------------------ the loop

    def run(self, requests: list[CoeRequest]) -> CoeReport:
        kv_reserve = self.w.batch_size * max(
            (r.prompt_tokens + r.output_tokens for r in requests), default=0
        )
        deploy = Deploy(
            platform=self.platform.name,
            router_model=self.router.name,
            expert_model=self.expert.name,
            experts=tuple(self.names),
            pinned=tuple(self.w.pinned_experts),
            kv_reserve_tokens=kv_reserve,
            region_bytes=self.w.reserved_hbm_bytes,
            expert_seeds=tuple(expert_seed(self.w.seed, i) for i in range(len(self.names)))
            if self.functional
            else (),
        )
        try:
            for replica in list(self._replicas):
                try:
                    run = self.executor.run(replica.index, [deploy], self.start_ns)
                except ReplicaFailed as e:
                    self._lose(replica, e, [])
                    continue
                replica.free_ns = run.end_ns
                replica.kv_pool_bytes = run.kv_free_bytes
                replica.resident = {self._index[n] for n in run.resident}
        except OutOfMemory as e:
            raise CoeOutOfMemory(
                CoeReport(
                    platform=self.platform.name,
                    decode_plan=self.decode_plan.value,
                    oom=True,
                    oom_reason=str(e),
                )
            ) from e

        results: list[RequestResult] = []
        served: Counter[int] = Counter()
        arrivals = deque(sorted(requests, key=lambda r: (r.arrival_ns, r.index)))
        while arrivals or any(n.queue for n in self._replicas):
            # The replica that can start a batch first, and when.
            ready = [
                (max(n.free_ns, self.start_ns + n.queue[0].arrival_ns), n.index)
                for n in self._replicas
                if n.queue
            ]
            t, which = min(ready) if ready else (None, -1)
            if arrivals and (t is None or self.start_ns + arrivals[0].arrival_ns <= t):
                r = arrivals.popleft()
                self._dispatch(r).push(r)
                continue
            assert t is not None
            replica = next(n for n in self._replicas if n.index == which)
            batch: list[CoeRequest] = []
            while (
                replica.queue
                and len(batch) < self.w.batch_size
                and self.start_ns + replica.queue[0].arrival_ns <= t
            ):
                batch.append(replica.pop())
            try:
                done = self._run_batch(replica, t, batch)
            except ReplicaFailed as e:
                moved = self._lose(replica, e, batch)
                arrivals = deque(sorted([*moved, *arrivals], key=lambda r: (r.arrival_ns, r.index)))
                continue
            results.extend(done)
            served.update(r.expert for r in batch)
            if self.progress is not None:
                self.progress(len(results), len(requests), replica.free_ns - self.start_ns)
        return self._report(results, served)

    def _lose(
        self, replica: _Replica, error: ReplicaFailed, batch: list[CoeRequest]
    ) -> list[CoeRequest]:
        """Drop a failed replica; its batch and queue, to re-route (none left: raise)."""
        self._replicas.remove(replica)
        moved = [*batch, *replica.queue]
        replica.queue.clear()
        replica.queued.clear()
        self._failed.append((replica, error.reason, len(moved)))
        if not self._replicas:
            raise error
        self._rerouted.update(r.index for r in moved)
        return moved

    def _dispatch(self, r: CoeRequest) -> _Replica:
        replicas = self._replicas
        if len(replicas) == 1:
            return replicas[0]
        if self.w.node_routing == "random":
            return replicas[int(self._rng.integers(len(replicas)))]
        shortest = min(len(n.queue) for n in replicas)
        holding = [
            n
            for n in replicas
            if n.expects(r.expert) and len(n.queue) < shortest + self.w.batch_size
        ]
        return min(holding or replicas, key=lambda n: (len(n.queue), n.free_ns, n.index))

    # ------------------------------------------------------------------ one batch

    def _run_batch(self, replica: _Replica, t: int, batch: list[CoeRequest]) -> list[RequestResult]:
        ops: list[Op] = [
            Kernel(
                self.router.name,
                Phase.PREFILL,
                self.prefill_plan,
                len(batch),
                max(r.prompt_tokens for r in batch),
                role="router",
            )
        ]
        groups: dict[int, list[CoeRequest]] = {}
        for r in batch:  # in arrival order: a group runs when its first request would
            groups.setdefault(r.expert, []).append(r)
        plans: list[_Group] = []
        for expert, members in groups.items():
            ops.append(Switch(self.names[expert]))
            plan = _Group(expert, len(ops) - 1, [])
            for requests in self._waves(replica, members):
                plan.waves.append(self._wave_ops(ops, expert, requests))
            plans.append(plan)

        run = self.executor.run(replica.index, ops, t)
        replica.free_ns = run.end_ns
        replica.resident = {self._index[n] for n in run.resident}
        out: list[RequestResult] = []
        for plan in plans:
            sw = run.ops[plan.switch]
            for wave in plan.waves:
                prefill_end = run.ops[wave.prefill].end_ns
                end = run.ops[wave.decode].end_ns if wave.decode is not None else prefill_end
                for k, r in enumerate(wave.requests):
                    arrival = self.start_ns + r.arrival_ns
                    tokens = list(run.ops[wave.generate[k]].tokens) if wave.generate else []
                    out.append(
                        RequestResult(
                            index=r.index,
                            expert=self.names[plan.expert],
                            replica=replica.index,
                            arrival_s=r.arrival_ns * 1e-9,
                            ttft_s=(prefill_end - arrival) * 1e-9,
                            tpot_s=(end - prefill_end) * 1e-9 / (r.output_tokens - 1)
                            if r.output_tokens > 1
                            else 0.0,
                            e2e_s=(end - arrival) * 1e-9,
                            switch_s=(sw.end_ns - sw.start_ns) * 1e-9,
                            hit=bool(sw.hit),
                            output_tokens=r.output_tokens,
                            tokens=tokens,
                            rerouted=r.index in self._rerouted,
                        )
                    )
        self._router_ns += _duration(run.ops[0])
        self._switches += [
            (self.names[p.expert], run.ops[p.switch]) for p in plans if not run.ops[p.switch].hit
        ]
        return out

    def _waves(self, replica: _Replica, members: list[CoeRequest]) -> list[list[CoeRequest]]:
        """Split a group so each wave's KV cache fits the replica's KV pool."""
        per_request = kv_tokens_bytes(
            self.expert, max(r.prompt_tokens + r.output_tokens for r in members), self.group
        )
        fit = replica.kv_pool_bytes // per_request if per_request else len(members)
        if fit < 1:
            raise OutOfMemory(
                f"replica {replica.index} sockets",
                "hbm",
                per_request,
                replica.kv_pool_bytes,
                what="the KV cache of one request (router, pins and region take the rest)",
            )
        if fit >= len(members):
            return [members]
        waves = [members[i : i + fit] for i in range(0, len(members), fit)]
        self._starved.append((len(members), fit, self._extra_ns(members, waves)))
        return waves

    def _wave_ops(self, ops: list[Op], expert: int, wave: list[CoeRequest]) -> _Wave:
        name = self.expert.name
        prompt = max(r.prompt_tokens for r in wave)
        out = max(r.output_tokens for r in wave)
        ops.append(
            Kernel(
                name, Phase.PREFILL, self.prefill_plan, len(wave), prompt,
                kv_tokens=len(wave) * prompt, role="prefill",
            )
        )  # fmt: skip
        prefill = len(ops) - 1
        decode = None
        if out > 1:
            ops.append(self._decode(len(wave), prompt, out))
            decode = len(ops) - 1
        generate = []
        if self.functional:
            for r in wave:
                ops.append(Generate(self.names[expert], r.prompt_ids, r.output_tokens))
                generate.append(len(ops) - 1)
        return _Wave(wave, prefill, decode, generate)

    def _decode(self, batch: int, prompt: int, out: int) -> Kernel:
        """The decode loop after the first token: `out - 1` steps at the mean context
        (as the predictor's decode_loop_s), kernel-looped on SN40L by default."""
        return Kernel(
            self.expert.name,
            Phase.DECODE,
            self.decode_plan,
            batch,
            prompt + max(1, (out - 1) // 2),
            steps=out - 1,
            kv_tokens=batch * (prompt + out),
            role="decode",
        )

    def _extra_ns(self, members: list[CoeRequest], waves: list[list[CoeRequest]]) -> int:
        """What splitting a group into waves costs over running it whole, by the model."""

        def cost(size: int, prompt: int, out: int) -> float:
            p = self.predictor
            t = p.step(self.expert, Phase.PREFILL, self.prefill_plan, size, prompt, self.group)
            total = p.invocation_s + t.total_s  # each wave's prefill is a call of its own
            if out > 1:
                d = self._decode(size, prompt, out)
                total += (
                    d.steps
                    * p.step(self.expert, Phase.DECODE, d.plan, size, d.seq, self.group).total_s
                )
            return total

        def of(rs: list[CoeRequest]) -> float:
            return cost(
                len(rs),
                max(r.prompt_tokens for r in rs),
                max(r.output_tokens for r in rs),
            )

        return round((sum(of(w) for w in waves) - of(members)) * 1e9)

    # ------------------------------------------------------------------ the report

    def _report(self, results: list[RequestResult], served: Counter[int]) -> CoeReport:
        results.sort(key=lambda r: r.index)
        replicas = [*self._replicas, *(f[0] for f in self._failed)]
        end = max((n.free_ns for n in replicas), default=self.start_ns)
        emulated_s = (end - self.start_ns) * 1e-9
        tokens = sum(r.output_tokens for r in results)
        # An empty job (no request) reports zeros, not the percentiles of nothing.
        lat = np.array([r.e2e_s for r in results] or [0.0])
        ttft = np.array([r.ttft_s for r in results] or [0.0])
        return CoeReport(
            platform=self.platform.name,
            decode_plan=self.decode_plan.value,
            requests=len(results),
            emulated_s=emulated_s,
            tokens=tokens,
            tokens_per_s=tokens / emulated_s if emulated_s else 0.0,
            router_s=self._router_ns * 1e-9,
            switch_s=sum(_duration(o) for _, o in self._switches) * 1e-9,
            switches=len(self._switches),
            switches_per_expert=dict(Counter(name for name, _ in self._switches)),
            diagnostics=tuple(self._diagnostics(emulated_s, served)),
            per_request=tuple(results),
            rerouted_requests=len(self._rerouted),
            failed_replicas=tuple(sorted(f[0].index for f in self._failed)),
            hbm_hit_rate=sum(r.hit for r in results) / len(results) if results else 0.0,
            p50_latency_s=float(np.percentile(lat, 50)),
            p99_latency_s=float(np.percentile(lat, 99)),
            p50_ttft_s=float(np.percentile(ttft, 50)),
            p99_ttft_s=float(np.percentile(ttft, 99)),
            mean_tpot_s=float(np.mean([r.tpot_s for r in results] or [0.0])),
        )

    def _diagnostics(self, emulated_s: float, served: Counter[int]) -> list[str]:
        out: list[str] = [
            f"replica {r.index} failed after emulated {(r.free_ns - self.start_ns) * 1e-9:.6g} s "
            f"({why}); {moved} request(s) were re-routed to the replicas left"
            for r, why, moved in self._failed
        ]
        if not self._starved:
            return out
        extra_s = sum(e for _, _, e in self._starved) * 1e-9
        share = extra_s / emulated_s if emulated_s else 0.0
        worst = min(self._starved, key=lambda s: s[1])
        pool = min(n.kv_pool_bytes for n in self._replicas)
        idle = [p for p in self.w.pinned_experts if served[self._index[p]] == 0]
        what = (
            f"the KV cache was starved: {len(self._starved)} expert group(s) could not run "
            f"as one batch (a group of {worst[0]} ran in waves of {worst[1]}), because "
            f"{pool / 1e9:.2f} GB per socket of HBM was left for the KV cache; the extra "
            f"passes cost {extra_s:.4f} s ({share:.1%} of the job)."
        )
        if idle:
            pinned = len(idle) * -(-self.expert.weight_bytes // self.group)
            out.append(
                f"{what} {len(idle)} pinned expert(s) ({', '.join(idle[:5])}"
                f"{', ...' if len(idle) > 5 else ''}) served no request yet hold "
                f"{pinned / 1e9:.2f} GB per socket of HBM: static weights of inactive models "
                f"belong in DDR. Fix: drop them from pinned_experts; the reserved region "
                f"switches an expert in on demand in {self._switch_s:.4f} s."
            )
        else:
            out.append(
                f"{what} Fix: a smaller batch_size, shorter prompts, fewer pinned experts "
                f"or a smaller reserved_hbm_bytes."
            )
        return out


def expert_seed(job_seed: int, expert: int) -> int:
    """Functional mode: the weight seed of expert `expert` of a job."""
    return job_seed * 1_000_003 + expert


def _duration(o: OpRun) -> int:
    return o.end_ns - o.start_ns


def check_functional(w: CoeWorkload) -> None:
    if w.expert_model != "tiny-lm":
        raise InvalidRequest(
            "spec.coe.expert_model: FUNCTIONAL CoE jobs generate real tokens with tiny "
            f"experts: use 'tiny-lm', not {w.expert_model!r}"
        )
