"""The fake rack (fake_rack.py) whose serve jobs run on real Socket objects, without Ray:
one socket per node speaks for the node's sockets (all sockets of a job's TP group run
the same steps), as FakeGateway's programs do. The speakers live as long as the gateway
(`close` ends them), so their timing caches stay warm from job to job. An endpoint
job's passes run on the speakers too."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import TracerProvider

from rdurack.errors import LinkFailure
from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.gateway import KernelRun, PassesRun
from rdurack.orchestrator.jobs import EndpointWorkload, KernelWorkload
from rdurack.rack.models import builtin_models
from rdurack.telemetry.propagation import inject
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.serving.stream.pricing import Pass
from tests.support.fake_rack import RACK, FakeGateway


class SocketGateway(FakeGateway):
    """FakeGateway, but a serve job's steps are Socket.serve calls, and an endpoint's
    passes Socket.run_passes calls."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        """`tracer_provider`: where the speakers' spans go (default: the global one)."""
        super().__init__()
        self.speakers: dict[int, Socket] = {}
        self.tracer_provider = tracer_provider

    def run_kernel(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: KernelWorkload,
        steps: int,
        start_ns: int,
        first_step: int = 0,
        group: Sequence[str] = (),
    ) -> list[KernelRun]:
        if not workload.serves:
            return super().run_kernel(
                node, job_id, sockets, workload, steps, start_ns, first_step, group
            )
        speaker = self._speaker(node)
        speaker.reserve(job_id)
        run = speaker.serve(job_id, workload.serve_request(), first_step, steps, start_ns)
        self._moved(node, run.end_ns)
        return [
            KernelRun(
                s, run.start_ns, run.end_ns, run.kernel_calls, run.hbm_bytes, run.flops,
                run.launch_ns, run.collective_ns,
            )
            for s in sockets
        ]  # fmt: skip

    def run_passes(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: EndpointWorkload,
        passes: Sequence[Pass],
        kv_tokens: int,
        start_ns: int,
        served: PassesServed | None = None,
    ) -> list[PassesRun]:
        if node == self.fail_node:
            raise LinkFailure(f"node {node}: link down")
        speaker = self._speaker(node)
        speaker.reserve(job_id)
        model = builtin_models()[workload.model].placed(None)
        # The caller's trace context, as a node agent hands it to its actors: the passes'
        # spans are in the trace of the RPC that asked for them.
        run = speaker.run_passes(
            job_id, model, workload.num_sockets, list(passes), kv_tokens, start_ns, inject(),
            served, workload.bundle,
        )  # fmt: skip
        self._moved(node, run.end_ns)
        return [PassesRun(s, run.start_ns, run.end_ns, run.durations_ns) for s in sockets]

    def _speaker(self, node: int) -> Socket:
        if node not in self.speakers:
            self.speakers[node] = Socket(
                f"rdu-n{node}-s0", RACK, tracer_provider=self.tracer_provider
            )
        return self.speakers[node]

    def _moved(self, node: int, end_ns: int) -> None:
        """Every socket of the node is where its speaker is: a next job starts there."""
        with self.lock:
            for s in self.clock:
                if s.startswith(f"rdu-n{node}-"):
                    self.clock[s] = end_ns

    def release(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        super().release(node, job_id, sockets)
        if node in self.speakers:
            self.speakers[node].release(job_id)

    def close(self) -> None:
        for speaker in self.speakers.values():
            speaker.close()
