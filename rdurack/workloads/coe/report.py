"""What a CoE job reports: each request's result, the job's report, and the two errors
that end a job early (a replica lost, a bundle too big for the platform, which carries
its report)."""

from __future__ import annotations

from pydantic import Field

from rdurack.config import Config
from rdurack.errors import LinkFailure


class ReplicaFailed(LinkFailure):
    """A replica cannot serve any more (a socket of its TP group or its agent died)."""

    def __init__(self, replica: int, reason: str) -> None:
        self.replica, self.reason = replica, reason
        super().__init__(f"replica {replica} failed: {reason}")

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return (type(self), (self.replica, self.reason))


class RequestResult(Config):
    """One request served: its times from arrival, emulated seconds."""

    index: int = 0
    expert: str = ""
    replica: int = 0  # the TP group that served it
    arrival_s: float = 0.0
    ttft_s: float = 0.0  # arrival to the end of its prefill (the first token)
    tpot_s: float = 0.0  # decode time per further token
    e2e_s: float = 0.0  # arrival to its last token
    switch_s: float = 0.0  # its group's DDR -> HBM switch (0 on a hit)
    hit: bool = False  # its expert was in HBM when its group started
    output_tokens: int = 0
    tokens: tuple[int, ...] = ()  # functional mode: the generated tokens
    rerouted: bool = False  # served here after its first replica failed


class CoeReport(Config):
    """What the serving engine reports of a job's requests, emulated seconds. Every field
    has a default (the proto's), so a stored report of an older release still reads."""

    platform: str = ""
    decode_plan: str = ""
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
    switches_per_expert: dict[str, int] = Field(default_factory=dict)
    oom: bool = False
    oom_reason: str = ""
    diagnostics: tuple[str, ...] = ()
    per_request: tuple[RequestResult, ...] = ()
    rerouted_requests: int = 0  # served by another replica after theirs failed
    failed_replicas: tuple[int, ...] = ()


class CoeOutOfMemory(Exception):
    """The bundle does not fit the platform; carries the report (oom set)."""

    def __init__(self, report: CoeReport) -> None:
        super().__init__(report.oom_reason)
        self.report = report
