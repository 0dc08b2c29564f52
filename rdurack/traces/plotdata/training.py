"""What the plots of a training job show: its loss per optimizer step, and per stage
(progressive: shrinking then growing, block by block) its peak memory and test
accuracy. Each from the job's spans, or from its result (`rdu job ID --json`) when the
trace has none."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from rdurack.telemetry import names
from rdurack.traces.spans import Span, hardware_spans

# A loss curve whose largest loss is over this many times its smallest is drawn on a
# log scale: losses that fall by decades.
LOG_SCALE_ABOVE = 100


def loss_points(result: Mapping[str, Any] | None) -> list[tuple[int, float]]:
    """(step, loss) pairs from a job result (`rdu job ID --json`): a `losses` list, per
    step from step 1, or a list of {"step", "loss"} objects or [step, loss] pairs.
    Empty when there are none."""
    if not result:
        return []
    raw = result.get("losses") or result.get("loss_curve") or []
    points: list[tuple[int, float]] = []
    for i, item in enumerate(raw):
        if isinstance(item, int | float) and not isinstance(item, bool):
            points.append((i + 1, float(item)))
        elif isinstance(item, Mapping) and "loss" in item:
            points.append((int(item.get("step", i + 1)), float(item["loss"])))
        elif isinstance(item, Sequence) and len(item) == 2:
            points.append((int(item[0]), float(item[1])))
    return [(s, x) for s, x in points if math.isfinite(x)]


def span_loss_points(spans: Sequence[Span]) -> list[tuple[int, float]]:
    """(step, loss) pairs from hardware spans carrying `rdurack.train.loss` and
    `rdurack.train.step` (the traced `rdu.train.step` spans). Each DDP rank reports its
    local batch's loss; with equal local batches their mean is the global batch's loss,
    so a step's loss is the mean over its ranks."""
    by_step: dict[int, list[float]] = {}
    for s in hardware_spans(spans):
        a = s.attributes
        if names.ATTR_LOSS in a and names.ATTR_STEP in a:
            loss = float(a[names.ATTR_LOSS])
            if math.isfinite(loss):
                by_step.setdefault(int(a[names.ATTR_STEP]), []).append(loss)
    return [(step, sum(xs) / len(xs)) for step, xs in sorted(by_step.items())]


def loss_log_scale(points: Sequence[tuple[int, float]]) -> bool:
    """Whether the losses fall by decades (LOG_SCALE_ABOVE), all of them above 0."""
    losses = [x for _, x in points]
    return all(x > 0 for x in losses) and max(losses) / min(losses) > LOG_SCALE_ABOVE


def loss_title(points: Sequence[tuple[int, float]], job_id: str) -> str:
    """'Job J: training loss, 8 steps, 2.1 → 0.5'; with the stride between traced
    steps when not every step is traced. `points` must not be empty."""
    steps = [s for s, _ in points]
    stride = min((b - a for a, b in pairwise(steps)), default=1)
    of = f"{len(points)} traced steps, one in {stride}" if stride > 1 else f"{len(points)} steps"
    return f"Job {job_id}: training loss, {of}, {points[0][1]:.4g} → {points[-1][1]:.4g}"


@dataclass(frozen=True)
class StagePoint:
    """One training stage as the stage figure draws it."""

    name: str  # "full", "shrink block 3", "grow block 0", ...
    peak_hbm_bytes: int  # the largest over the job's sockets
    peak_ddr_bytes: int
    accuracy: float | None  # the stage's model on the held-out split
    steps: int
    converged: bool  # ended by the movement metric

    @property
    def label(self) -> str:
        """The stage under its bars: 'grow 0\\n25 steps ✓' (✓: the movement metric
        ended it)."""
        mark = " ✓" if self.converged else ""
        return f"{self.name.replace(' block ', ' ')}\n{self.steps} steps{mark}"


def stage_points(spans: Sequence[Span]) -> list[StagePoint]:
    """The stages of a training job from its `rdu.train.stage` spans (one per rank per
    stage), in training order: peaks the largest over ranks, accuracy rank 0's."""
    by_name: dict[str, list[Span]] = {}
    for span in sorted(hardware_spans(spans), key=lambda s: s.emulated_start_ns):
        if span.name == names.SPAN_TRAIN_STAGE:
            name = str(span.attributes.get(names.ATTR_TRAIN_STAGE, "?"))
            by_name.setdefault(name, []).append(span)
    points = []
    for name, mine in by_name.items():
        a = [s.attributes for s in mine]
        accuracy = next(
            (float(x[names.ATTR_TRAIN_ACCURACY]) for x in a if names.ATTR_TRAIN_ACCURACY in x),
            None,
        )
        points.append(
            StagePoint(
                name,
                max(int(x.get(names.ATTR_PEAK_BYTES.format(tier="hbm"), 0)) for x in a),
                max(int(x.get(names.ATTR_PEAK_BYTES.format(tier="ddr"), 0)) for x in a),
                accuracy,
                int(a[0].get(names.ATTR_STEPS, 0)),
                bool(a[0].get(names.ATTR_TRAIN_CONVERGED, False)),
            )
        )
    return points


def result_stage_points(result: Mapping[str, Any] | None) -> list[StagePoint]:
    """The stages of a job result (`rdu job ID --json`); empty without any."""
    return [
        StagePoint(
            str(st.get("name", "?")),
            int(st.get("peak_hbm_bytes", 0)),
            int(st.get("peak_ddr_bytes", 0)),
            float(st["test_accuracy"]) if st.get("test_accuracy") is not None else None,
            int(st.get("steps", 0)),
            bool(st.get("converged", False)),
        )
        for st in (result or {}).get("stages") or []
    ]
