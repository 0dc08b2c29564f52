"""The spans of one DDP rank's training (node_agent/training/spans.py says which), on
the socket's emulated timeline: gathered as the rank runs, emitted after each segment.

A step ends when its gradients are all-reduced: the compute stream waits for them
there rather than at the next forward, which changes no emulated time, as whatever runs
next (a forward, a collective, a stage change) waits first. A checkpoint is a span of
no emulated time (the emulator prices no storage). A stage's span covers its steps from
the end of its weights' moves between tiers; a block's freeze span runs from the end of
the stage that froze it to the end of the next stage's moves (its state gone, the next
block's in).
"""

from __future__ import annotations

import math

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from rdurack.node_agent.timeline.hardware_trace import HardwareTrace, link_attributes
from rdurack.node_agent.training.spans import GradientWindow, TrainSpan, traced
from rdurack.rack.spec import Tier
from rdurack.telemetry import names
from rdurack.workloads.training.job import RankReport
from rdurack.workloads.training.progressive import StageReport
from rdurack.workloads.training.rank import CheckpointEvent, StepInfo


class RankRecorder:
    """The spans of rank `rank` of one job, of a model of `blocks` blocks."""

    def __init__(self, rank: int, blocks: int) -> None:
        self.rank = rank
        self.blocks = blocks
        self.beside: list[TrainSpan] = []  # stages and freezes not yet traced
        self.inside: list[TrainSpan] = []  # the segment's steps and checkpoints
        self.untraced = 0  # the segment's steps without a span (spans.traced)
        self.steps = 0  # the segment's steps
        self.stage_ns: list[tuple[int, int]] = []  # each ended stage's emulated start, end
        self._stage_began = 0
        self._exposed_mark = 0  # the backend's exposed ns when the last step ended
        self._freezing: tuple[int, dict[str, AttributeValue]] | None = None  # start, attrs

    def stage_began(self, now_ns: int) -> None:
        """A stage's weights are in place: it begins, and a block frozen before it is
        done."""
        if self._freezing is not None:
            start, frozen = self._freezing
            self.beside.append(TrainSpan(names.SPAN_TRAIN_FREEZE, start, now_ns, frozen))
            self._freezing = None
        self._stage_began = now_ns

    def stage_ended(self, stage: str, r: StageReport, end_ns: int) -> None:
        """Stage `stage` ended: its span, and the freeze of the block a growing stage
        trained."""
        self.stage_ns.append((self._stage_began, end_ns))
        ended: dict[str, AttributeValue] = {
            names.ATTR_RANK: self.rank,
            names.ATTR_STEP: r.start_step + r.steps,
            names.ATTR_TRAIN_CONVERGED: r.converged,
        }
        if r.block is not None:
            ended[names.ATTR_TRAIN_BLOCK] = r.block
        if r.movement is not None:
            ended[names.ATTR_TRAIN_MOVEMENT] = r.movement
        attributes: dict[str, AttributeValue] = {
            **ended,
            names.ATTR_TRAIN_STAGE: stage,
            names.ATTR_TRAIN_PHASE: r.phase,
            names.ATTR_STEPS: r.steps,
            **{names.ATTR_PEAK_BYTES.format(tier=t): n for t, n in r.peak_bytes.items()},
        }
        if r.test_accuracy is not None:
            attributes[names.ATTR_TRAIN_ACCURACY] = r.test_accuracy
        self.beside.append(TrainSpan(names.SPAN_TRAIN_STAGE, self._stage_began, end_ns, attributes))
        if r.phase == "grow" and r.block is not None:
            if r.block == self.blocks - 1:  # the last: nothing follows it in
                self.beside.append(TrainSpan(names.SPAN_TRAIN_FREEZE, end_ns, end_ns, ended))
            else:
                self._freezing = (end_ns, ended)

    def step_ended(
        self,
        info: StepInfo,
        began_ns: int,
        end_ns: int,
        gradients: GradientWindow | None,
        exposed_ns: int,
        peaks: dict[str, int],
    ) -> None:
        """A step ended, its gradients all-reduced in `gradients`: its span, if it is
        traced. `exposed_ns`: all the communication the compute stream waited for so
        far; `peaks`: the step's peak bytes per tier."""
        exposed, self._exposed_mark = exposed_ns - self._exposed_mark, exposed_ns
        if not traced(info.step, info.total):
            self.skipped()
            return
        self.steps += 1
        step: dict[str, AttributeValue] = {names.ATTR_RANK: self.rank, names.ATTR_STEP: info.step}
        attributes: dict[str, AttributeValue] = {
            **step,
            names.ATTR_TRAIN_STAGE: info.stage,
            **{names.ATTR_PEAK_BYTES.format(tier=t): n for t, n in peaks.items()},
        }
        if math.isfinite(info.loss):  # timing mode computes no loss
            attributes[names.ATTR_LOSS] = info.loss
        children: tuple[TrainSpan, ...] = ()
        if gradients is not None:
            w = gradients
            reduce: dict[str, AttributeValue] = {
                **step,
                names.ATTR_COLLECTIVE_ALGORITHM: "ring",
                names.ATTR_BYTES: w.nbytes,
                names.ATTR_BUCKETS: w.buckets,
                names.ATTR_EXPOSED_NS: exposed,
                names.ATTR_BYTES_SENT: w.bytes_sent,
                names.ATTR_BYTES_RECEIVED: w.bytes_received,
                **link_attributes(w.links),
            }
            children = (TrainSpan(names.SPAN_TRAIN_ALLREDUCE, w.start_ns, w.end_ns, reduce),)
        self.inside.append(TrainSpan(names.SPAN_TRAIN_STEP, began_ns, end_ns, attributes, children))

    def skipped(self) -> None:
        """A step ended that gets no span."""
        self.steps += 1
        self.untraced += 1

    def checkpoint(self, event: CheckpointEvent, now_ns: int) -> None:
        """A checkpoint written or loaded, after the step's all-reduce it holds the
        result of."""
        attributes: dict[str, AttributeValue] = {
            names.ATTR_RANK: self.rank,
            names.ATTR_STEP: event.step,
            names.ATTR_CHECKPOINT_ACTION: event.action,
            names.ATTR_CHECKPOINT_PATH: event.path,
            names.ATTR_BYTES: event.nbytes,
            names.ATTR_TIER: Tier.HBM.value,  # where the state is read from / loaded into
        }
        self.inside.append(TrainSpan(names.SPAN_CHECKPOINT, now_ns, now_ns, attributes))

    def segment(
        self,
        hardware: HardwareTrace,
        parent: Context,
        job_id: str,
        model: str,
        began_ns: int,
        report: RankReport,
    ) -> None:
        """Emit a segment that began at `began_ns` and ended as `report` says: its
        `rdu.train` span (first: the job's first span on a socket anchors the others),
        child of `parent`, with its steps and checkpoints inside, and the stages and
        freezes gathered since the last segment beside it."""
        span = hardware.span(
            names.SPAN_TRAIN,
            parent,
            job_id,
            began_ns,
            report.end_ns,
            {
                names.ATTR_RANK: report.rank,
                names.ATTR_STEPS: self.steps,
                names.ATTR_STEPS_UNTRACED: self.untraced,
                names.ATTR_STEP: report.step,
                names.ATTR_JOB_MODEL: model,
                names.ATTR_ALLREDUCE_NS: report.all_reduce_ns,
                names.ATTR_EXPOSED_NS: report.exposed_ns,
                names.ATTR_HBM_BYTES: report.hbm_peak_bytes,
            },
        )
        hardware.tree(self.inside, trace.set_span_in_context(span), job_id, {})
        hardware.tree(self.beside, parent, job_id, {names.ATTR_JOB_MODEL: model})
        self.beside, self.inside, self.untraced, self.steps = [], [], 0, 0
