"""Diagnostics: a training run's findings about how it was set up wrong.

Errors stop a run (a wrong world size cannot train at all); diagnostics are recorded
and the run goes on, because the mistake only costs correctness or efficiency (replicas
that never agree, samples every rank processes). Each names the mistake in the
article's words and carries its numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Codes, stable for tests and for whoever turns diagnostics into job events.
REPLICAS_DIFFER = "replicas-differ"
DUPLICATE_SAMPLES = "duplicate-samples"
EVERY_RANK_CHECKPOINTS = "every-rank-checkpoints"  # a script's ranks saved one file
# A script's mistakes that stop it (node_agent/training/script_checks.py): its error
# starts with the code in brackets.
WRONG_WORLD_SIZE = "wrong-world-size"
TWO_PROCESSES_PER_SOCKET = "two-processes-per-socket"
WRONG_RANK = "wrong-rank"
STRAGGLER_TIMEOUT = "straggler-timeout"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str  # one of the codes above
    message: str  # one line for a person, with the numbers
    step: int  # training step (optimizer updates done) when it was found
    data: dict[str, Any] = field(default_factory=dict)  # the numbers, for programs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
