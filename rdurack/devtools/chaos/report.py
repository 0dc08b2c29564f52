"""What a chaos run found: the faults it injected (`FaultRecord`), and the audit of the
job store (`audit`) that fills its report (`ChaosReport`): jobs submitted, succeeded,
retried, re-routed, failed and why, and the verdict, `lost: N, hanging: M`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.results import CoeResult
from rdurack.orchestrator.store import JobStore


@dataclass
class FaultRecord:
    at_s: float  # since the window opened, wall s
    fault: str
    id: str = ""
    skipped: str = ""  # why it could not be injected
    detected_s: float | None = None  # kill faults: until GetRack showed the target down
    healed: str = ""


@dataclass
class ChaosReport:
    seed: int
    window_s: float
    faults: list[FaultRecord] = field(default_factory=list)
    submitted: int = 0
    refused: list[str] = field(default_factory=list)  # submissions never acknowledged
    states: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    rerouted: int = 0  # CoE jobs that re-routed requests
    failed: dict[str, str] = field(default_factory=dict)  # job -> error
    lost: list[str] = field(default_factory=list)
    hanging: dict[str, str] = field(default_factory=dict)  # job -> state
    audited: str = ""  # the job store read
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.audited) and not self.lost and not self.hanging

    def lines(self) -> list[str]:
        out = [
            f"chaos: seed {self.seed}, {self.window_s:.0f} s of faults, {self.wall_s:.0f} s in all"
        ]
        for f in self.faults:
            line = f"  +{f.at_s:5.1f} s  {f.fault}"
            line += f" ({f.id})" if f.id else f": skipped: {f.skipped}"
            if f.detected_s is not None:
                line += f"; down in GetRack after {f.detected_s:.2f} s"
            if f.healed:
                line += f"; {f.healed}"
            out.append(line)
        s = self.states
        out.append(
            f"jobs: submitted {self.submitted}, succeeded {s.get('SUCCEEDED', 0)}, "
            f"retried {self.retried}, re-routed {self.rerouted}, failed {s.get('FAILED', 0)}, "
            f"cancelled {s.get('CANCELLED', 0)}"
        )
        for reason, n in Counter(_short(e) for e in self.failed.values()).most_common():
            out.append(f"  failed x{n}: {reason}")
        for r in self.refused:
            out.append(f"  refused: {r}")
        if not self.audited:
            out.append("lost and hanging: unknown (the job store was not read)")
        else:
            out.append(
                f"lost: {len(self.lost)}, hanging: {len(self.hanging)} "
                f"(checked against the job store {self.audited})"
            )
        for job_id in self.lost:
            out.append(f"  lost: {job_id}")
        for job_id, state in self.hanging.items():
            out.append(f"  hanging: {job_id} {state}")
        return out


def audit(report: ChaosReport, path: Path, ids: Iterable[str]) -> None:
    """Read the job store at `path` itself: every acknowledged job (`ids`) is there, and
    finished. Fills `report`'s states, failures, retries, re-routes, lost and hanging."""
    with JobStore(path) as store:
        jobs = {j.id: j for j in store.list()}
        for job_id in ids:
            job = jobs.get(job_id)
            if job is None:
                report.lost.append(job_id)
                continue
            report.states[job.state.value] = report.states.get(job.state.value, 0) + 1
            if not job.state.terminal:
                report.hanging[job_id] = job.state.value
            if job.state is JobState.FAILED:
                report.failed[job_id] = job.error
            retries = [
                e
                for e in store.events(job_id)
                if e.kind == "state"
                and e.payload.get("state") == JobState.PENDING.value
                and str(e.payload.get("reason", "")).startswith("retrying")
            ]
            report.retried += bool(retries)
            coe = job.result if isinstance(job.result, CoeResult) else None
            report.rerouted += bool(coe and coe.rerouted_requests)
    report.audited = str(path)


def _short(error: str) -> str:
    return " ".join(error.split())[:200] or "(no reason recorded)"
