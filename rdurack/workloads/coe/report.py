"""What a CoE job reports: each request's result, the job's report, and the two errors
that end a job early (a replica lost, a bundle too big for the platform, which carries
its report)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rdurack.errors import LinkFailure


class ReplicaFailed(LinkFailure):
    """A replica cannot serve any more (a socket of its TP group or its agent died)."""

    def __init__(self, replica: int, reason: str) -> None:
        self.replica, self.reason = replica, reason
        super().__init__(f"replica {replica} failed: {reason}")

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return (type(self), (self.replica, self.reason))


@dataclass(frozen=True)
class RequestResult:
    index: int
    expert: str
    replica: int
    arrival_s: float
    ttft_s: float  # arrival to the end of its prefill (the first token)
    tpot_s: float  # decode time per further token
    e2e_s: float  # arrival to its last token
    switch_s: float  # its group's DDR -> HBM switch (0 on a hit)
    hit: bool  # its expert was in HBM when its group started
    output_tokens: int
    tokens: list[int] = field(default_factory=list)  # functional mode: the generated tokens
    rerouted: bool = False  # served here after its first replica failed


@dataclass
class CoeReport:
    platform: str
    decode_plan: str
    requests: int = 0
    emulated_s: float = 0.0
    tokens: int = 0
    tokens_per_s: float = 0.0
    router_s: float = 0.0
    switch_s: float = 0.0  # all switching, summed over replicas
    switches: int = 0
    hbm_hit_rate: float = 0.0  # requests whose expert was in HBM / requests
    p50_latency_s: float = 0.0
    p99_latency_s: float = 0.0
    p50_ttft_s: float = 0.0
    p99_ttft_s: float = 0.0
    mean_tpot_s: float = 0.0
    switches_per_expert: dict[str, int] = field(default_factory=dict)
    oom: bool = False
    oom_reason: str = ""
    diagnostics: list[str] = field(default_factory=list)
    per_request: list[RequestResult] = field(default_factory=list)
    rerouted_requests: int = 0  # served by another replica after theirs failed
    failed_replicas: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CoeOutOfMemory(Exception):
    """The bundle does not fit the platform; carries the report (oom set)."""

    def __init__(self, report: CoeReport) -> None:
        super().__init__(report.oom_reason)
        self.report = report
