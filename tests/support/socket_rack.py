"""The fake rack (fake_rack.py) whose serve jobs run on real Socket objects, without Ray:
one socket per node speaks for the node's sockets (all sockets of a job's TP group run
the same steps), as FakeGateway's programs do. The speakers live as long as the gateway
(`close` ends them), so their timing caches stay warm from job to job. An endpoint
job's passes run on the speakers too."""

from __future__ import annotations

from collections.abc import Sequence

from rdurack.errors import LinkFailure
from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.gateway import KernelRun, PassesRun
from rdurack.orchestrator.jobs import EndpointWorkload, KernelWorkload
from rdurack.rack.models import builtin_models
from rdurack.workloads.serving.stream.pricing import Pass
from tests.support.fake_rack import RACK, FakeGateway


class SocketGateway(FakeGateway):
    """FakeGateway, but a serve job's steps are Socket.serve calls, and an endpoint's
    passes Socket.run_passes calls."""

    def __init__(self) -> None:
        super().__init__()
        self.speakers: dict[int, Socket] = {}

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
    ) -> list[PassesRun]:
        if node == self.fail_node:
            raise LinkFailure(f"node {node}: link down")
        speaker = self._speaker(node)
        speaker.reserve(job_id)
        model = builtin_models()[workload.model].placed(None)
        run = speaker.run_passes(
            job_id, model, workload.num_sockets, list(passes), kv_tokens, start_ns
        )
        self._moved(node, run.end_ns)
        return [PassesRun(s, run.start_ns, run.end_ns, run.durations_ns) for s in sockets]

    def _speaker(self, node: int) -> Socket:
        if node not in self.speakers:
            self.speakers[node] = Socket(f"rdu-n{node}-s0", RACK)
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
