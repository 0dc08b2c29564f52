"""What a DDP rank's training leaves for its trace: spans on the socket's emulated
timeline, gathered while the rank runs and emitted after each segment
(training/recorder.py).

- Stage and block-freeze spans sit beside the segment's `rdu.train` span (a stage may
  cover several segments).
- Inside the segment: an `rdu.train.step` span per traced step, each with an
  `rdu.train.allreduce` child (its gradient all-reduce on the communication stream), and
  an `rdu.checkpoint` span for each checkpoint written or loaded.

The bound: a rank traces at most `MAX_TRACED_STEPS` steps per job, evenly spaced
(`traced`), so a job of hundreds of steps makes at most that many step spans per rank;
each segment says how many of its steps it left untraced. Gradient all-reduces make no
per-transfer spans: a step's all-reduce span names the links it sent on instead.

This module imports no training code: a socket imports it at its start (through
timeline/hardware_trace.py, which draws these spans), and the training stack only when a
job trains (node_agent/socket.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.util.types import AttributeValue

# Assumption: 64 steps per rank per job is enough to see a loss curve's shape and a
# step's anatomy in Jaeger, and keeps a 16-rank job at about 2 x 64 x 16 = 2048 step
# and all-reduce spans.
MAX_TRACED_STEPS = 64


def traced(step: int, total: int, limit: int = MAX_TRACED_STEPS) -> bool:
    """Whether step `step` (from 1, the job's global count) of a run of at most `total`
    steps gets a span: steps 1, 1 + k, 1 + 2k, ... with k = ceil(total / limit), so at
    most `limit` of them, the first always among them."""
    stride = max(1, -(-total // limit))
    return (step - 1) % stride == 0


@dataclass(frozen=True)
class TrainSpan:
    """A span a rank's training produced, on the socket's emulated timeline; its
    children nest inside it."""

    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    children: tuple[TrainSpan, ...] = ()


@dataclass
class GradientWindow:
    """One step's gradient all-reduce on the communication stream: from the first
    bucket's start to the last one's end, emulated ns."""

    start_ns: int
    end_ns: int
    nbytes: int = 0  # gradient bytes all-reduced (the buckets' sizes)
    buckets: int = 0
    bytes_sent: int = 0  # over this rank's links
    bytes_received: int = 0
    links: dict[str, str] = field(default_factory=dict)  # link sent on -> kind, first first

    def add(self, end_ns: int, nbytes: int, traffic: SentAndReceived) -> None:
        """A bucket's all-reduce of `nbytes` ended at `end_ns`, with `traffic`."""
        self.end_ns = end_ns
        self.nbytes += nbytes
        self.buckets += 1
        self.bytes_sent += traffic.bytes_sent
        self.bytes_received += traffic.bytes_received
        self.links.update(traffic.links())


class SentAndReceived(Protocol):
    """What a collective's traffic tells (timeline/hardware_trace.py's Traffic)."""

    bytes_sent: int
    bytes_received: int

    def links(self) -> dict[str, str]: ...
