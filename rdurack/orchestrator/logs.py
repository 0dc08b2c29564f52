"""What a script job's ranks printed: their logs, read from the job's directory (the
orchestrator's checkpoint directory, which the node agents write too)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.job import log_path

MAX_LOG_BYTES = 1 << 20  # of one rank's log in one answer: its tail


@dataclass(frozen=True)
class RankLog:
    rank: int
    text: str
    truncated: bool  # only the last MAX_LOG_BYTES


def read_logs(job_dir: Path, world_size: int, rank: int | None = None) -> list[RankLog]:
    """The logs of ranks 0..world_size-1 (or of `rank`) that exist under `job_dir`."""
    if rank is not None and not 0 <= rank < world_size:
        raise InvalidRequest(f"rank: {rank} is not a rank of a job of {world_size}")
    logs = []
    for r in [rank] if rank is not None else range(world_size):
        path = log_path(job_dir, r)
        if not path.is_file():
            continue
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - MAX_LOG_BYTES))
            tail = f.read()
        # A tail may start inside a character: drop the broken bytes.
        logs.append(RankLog(r, tail.decode(errors="replace"), size > MAX_LOG_BYTES))
    return logs
