"""The reference training loop: what a torch DDP script does, rank by rank.

`train(ctx, spec)` runs on every rank of a job. In order, as a user writes it: build
the data and the model (each process initialises its own replica); optionally resume
from the newest checkpoint with map_location set to the rank's own socket; wrap the
model in torch's DistributedDataParallel; per epoch, DistributedSampler.set_epoch and
batches of global_batch / world_size samples; forward, backward (gradients averaged
over ranks), optimizer step; a checkpoint by rank 0 every `checkpoint_every` steps;
test accuracy on rank 0 at the end.

Two of the article's mistakes can be switched on to see them diagnosed:
`broadcast_parameters=False` (replicas start from their own random parameters and never
agree) and `sampler="none"` (a loader without DistributedSampler: every rank walks the
whole dataset in the same order, so the ranks process the same samples).

The strategy (progressive.py) sets the stages: `full` trains the whole model in one
stage; `progressive` (ProFL) trains an MLP block by block, shrinking then growing, each
block until its effective movement (progressive.py) says it has converged or its stage's
step budget (`steps` / `epochs`, per stage) is spent. Data order runs on across stages
(the sampler's epochs continue). A `MemoryAccount` in the context mirrors what the rank
holds, stage by stage, on its socket's tiers (memory.py).

Gradients are averaged by torch's own `DistributedDataParallel`, given a process group
over the rank's `Backend` (group.py): the socket's gRPC links on the rack, one rank per
socket actor; `train_threaded(spec)` runs every rank on a thread of a `ThreadGroup`.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler

from rdurack.errors import InvalidRequest
from rdurack.rack.memory import TieredMemory
from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.backend import Backend, ThreadGroup
from rdurack.workloads.training.checkpoint import (
    TrainingState,
    latest,
    load,
    save,
    state_bytes,
)
from rdurack.workloads.training.checks import check_replicas, check_same_start, duplicate_samples
from rdurack.workloads.training.data import Array, Params, copy_params, load_data
from rdurack.workloads.training.data import Dataset as Samples
from rdurack.workloads.training.group import BackendGroup, barrier, broadcast
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.models import Trainable, optimizer_bytes
from rdurack.workloads.training.progressive import EffectiveMovement, StageReport
from rdurack.workloads.training.rank import (
    DUPLICATE_SAMPLES,
    CheckpointEvent,
    Diagnostic,
    RankContext,
    RankResult,
    StageEvent,
    StepInfo,
    TrainSpec,
)
from rdurack.workloads.training.scaling import bucket_bytes
from rdurack.workloads.training.strategy import Trainee, make_optimizer

SOCKETS_PER_NODE = 8  # SN40L node: rank r runs on socket r % 8 of node r // 8
MIB = 1024 * 1024


def accuracy(model: Trainable, data: Samples) -> float:
    """Share of `data` whose highest logit is the label."""
    predicted = model.logits(data.x).argmax(axis=1)
    return float(np.mean(predicted == data.y))


def train(ctx: RankContext, spec: TrainSpec) -> RankResult:
    """Train on this rank; every rank of the group calls it with the same spec."""
    steps = train_steps(ctx, spec)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: RankResult = done.value
            return result


def train_steps(ctx: RankContext, spec: TrainSpec) -> Generator[StepInfo, None, RankResult]:
    """`train`, one optimizer step at a time: yields after each step, returns the
    result. A caller can run a job in segments (progress between them)."""
    transport = ctx.transport
    if (spec.world_size, ctx.rank) != (transport.world_size, transport.rank):
        raise InvalidRequest(
            f"rank {ctx.rank} of world_size {spec.world_size}, but the process group holds "
            f"rank {transport.rank} of {transport.world_size}: every rank must be given "
            "its own rank and the group's real size"
        )
    transport.set_timeout(spec.timeout_s)
    group = BackendGroup(transport)
    rank, world = group.rank(), group.size()
    (train_set, test_set), classes = load_data(spec)
    # Each process initialises its own replica, seeded by rank as independent processes
    # effectively are: only DDP's broadcast from rank 0 makes them agree.
    trainee = Trainee(
        spec.strategy,
        spec.model,
        train_set.features,
        classes,
        spec.seed + rank,
        spec.hidden,
        spec.blocks,
    )
    # The augmentation RNG is the same stream on every rank (so rank 0's checkpointed
    # state restores every rank); each rank uses its own rows of the global batch's noise.
    rng = np.random.default_rng([spec.seed, 1])
    step = 0
    resumed: TrainingState | None = None
    if spec.resume and ctx.checkpoint_dir is not None and spec.strategy == "full":
        path = latest(ctx.checkpoint_dir)
        if path is not None:
            resumed = load(path, device=ctx.device, map_location=ctx.device)
            _restore(trainee.model.params, resumed.params, path)
            if resumed.rng is not None:
                rng.bit_generator.state = resumed.rng
            step = resumed.step
            if ctx.on_checkpoint is not None:
                ctx.on_checkpoint(CheckpointEvent("load", step, str(path), state_bytes(resumed)))
    start_step = step
    check_same_start(group, step)
    if spec.strategy != "full" and spec.broadcast_parameters:
        # Every block and output module, once: a stage's DDP sees only what it trains.
        _broadcast_all(group, trainee.params)

    n = len(train_set.y)
    batches = _Batches(group, spec, n, step)
    budget = batches.budget  # steps per stage
    total = budget * len(trainee.stages)
    account = ctx.memory
    losses: list[float] = []
    diagnostics: list[Diagnostic] = []
    written: list[str] = []
    reports: list[StageReport] = []
    samples = 0
    buckets: list[int] = []
    for stage in trainee.stages:
        model = trainee.stage_model(stage)
        optimizer = make_optimizer(spec, model)
        if resumed is not None:
            optimizer.load_state_dict(resumed.optimizer)
            resumed = None
        block = trainee.block_params(stage)
        movement = (
            EffectiveMovement(block, spec.freeze_window, spec.freeze_threshold, seed=spec.seed)
            if block is not None
            else None
        )
        copy_s = 0.0
        if account is not None:
            copy_s = account.place(trainee.holdings(stage, model, movement))
            account.begin_stage()
            account.hold("optimizer", Tier.HBM, optimizer_bytes(optimizer))  # a resumed one
        if ctx.on_stage is not None:
            ctx.on_stage(StageEvent(stage, step, copy_s))
        timing = ctx.timing(model) if ctx.timing is not None else None
        # torch's DDP: rank 0's parameters broadcast at construction (progressive: every
        # parameter was, above), then each backward's gradients averaged bucket by bucket.
        ddp = DistributedDataParallel(
            model.net,
            process_group=group,
            bucket_cap_mb=spec.bucket_cap_bytes / MIB,
            init_sync=spec.broadcast_parameters and stage.block is None,
        )
        found = check_replicas(
            group, model.params, step, at_start=True, broadcast=spec.broadcast_parameters
        )
        began = step
        # Full training counts its budget from step 0 (a resumed run finishes it); a
        # progressive stage from its own start.
        end = budget if stage.block is None else began + budget
        converged = False
        while step < end and not converged:
            if spec.check_every and step > began and (step - began) % spec.check_every == 0:
                later = check_replicas(group, model.params, step, at_start=False, broadcast=True)
                found = found or later
            idx = batches.next()
            x, y = train_set.x[idx], train_set.y[idx]
            if spec.input_noise:
                noise = rng.standard_normal((spec.global_batch, x.shape[1]), dtype=np.float32)
                # Rank r's row k is row r + k * world of the global batch.
                x = x + noise[rank::world] * float(spec.input_noise)
            if timing is not None:
                timing.forward()
            losses.append(model.forward(x, y, ddp))
            if account is not None:
                account.hold("activations", Tier.HBM, model.saved_bytes())
            if timing is not None:
                timing.backward()  # before autograd: it says when each bucket is ready
            model.backward()  # DDP all-reduces the buckets as their gradients are ready
            if account is not None:
                account.release("activations")  # backward is done with them
            optimizer.step()
            if account is not None:
                account.hold("optimizer", Tier.HBM, optimizer_bytes(optimizer))
            samples += len(idx)
            step += 1
            window = movement.update() if movement is not None else None
            if movement is not None and window is not None:  # a window ended, on every rank
                converged = _agree(group, movement.converged(window))
            yield StepInfo(step, total, losses[-1], stage.name)
            if spec.checkpoint_every and step % spec.checkpoint_every == 0:
                if ctx.checkpoint_dir is not None and rank == 0:
                    state = TrainingState(
                        params=trainee.model.params,
                        optimizer=optimizer.state_dict(),
                        step=step,
                        epoch=batches.epoch,
                        rng=dict(rng.bit_generator.state),
                        device=ctx.device,
                        extra={"world_size": world, "global_batch": spec.global_batch},
                    )
                    path = save(ctx.checkpoint_dir, state, rank=rank)
                    if path is not None:
                        written.append(str(path))
                        if ctx.on_checkpoint is not None:
                            ctx.on_checkpoint(
                                CheckpointEvent("save", step, str(path), state_bytes(state))
                            )
                barrier(group)  # as torch's tutorial: nobody reads a half-written file
        del ddp  # its reducer's hooks go with it: the next stage's DDP takes over
        report = StageReport(
            phase=stage.phase,
            block=stage.block,
            start_step=began,
            steps=step - began,
            converged=converged,
            movement=movement.last if movement is not None else None,
            loss=losses[-1] if step > began else None,
            test_accuracy=accuracy(model, test_set) if rank == 0 else None,
            peak_bytes=account.end_stage() if account is not None else {},
        )
        reports.append(report)
        if ctx.on_stage is not None:
            ctx.on_stage(StageEvent(stage, step, report=report))
        if found is not None and not any(d.code == found.code for d in diagnostics):
            diagnostics.append(found)
        buckets = list(bucket_bytes(model.params, spec.bucket_cap_bytes))
    diagnostics = diagnostics + batches.diagnostics
    test_acc = accuracy(trainee.model, test_set) if rank == 0 else None
    barrier(group)
    return RankResult(
        rank=rank,
        device=ctx.device,
        losses=losses,
        final_loss=losses[-1] if losses else None,
        test_accuracy=test_acc,
        diagnostics=diagnostics,
        samples_seen=samples,
        start_step=start_step,
        steps=step,
        epochs=batches.entered,
        bucket_bytes=buckets,
        checkpoints=written,
        params=copy_params(trainee.params),
        stages=reports,
        peak_bytes=dict(account.peaks) if account is not None else {},
    )


def _agree(group: BackendGroup, mine: bool) -> bool:
    """Rank 0's decision, on every rank (one tiny broadcast): replicas that drifted
    apart (no initial broadcast) must still end a stage at the same step."""
    flag = torch.tensor([1.0 if mine else 0.0])
    broadcast(group, flag, src=0)
    return bool(flag[0])


def _broadcast_all(group: BackendGroup, params: Params) -> None:
    """Rank 0's `params` to every rank, in place, as one flat buffer (torch's
    `_sync_module_states` coalesces the same way, up to 250 MiB a buffer)."""
    flat = torch.from_numpy(np.concatenate([p.ravel() for p in params.values()]))
    broadcast(group, flat, src=0)
    offset = 0
    for p in params.values():
        p[...] = flat[offset : offset + p.size].numpy().reshape(p.shape)
        offset += p.size


class _Batches:
    """This rank's sample indices, batch after batch, epoch after epoch: the
    DistributedSampler's shard (or, with `sampler: none`, the whole dataset), drop_last.
    At each epoch's start the ranks compare their indices (duplicate samples)."""

    def __init__(self, group: BackendGroup, spec: TrainSpec, n: int, step: int) -> None:
        self.group, self.spec, self.n = group, spec, n
        world, rank = group.size(), group.rank()
        # torch's sampler only needs the dataset's length: the indices are what it gives.
        indices = cast("Dataset[int]", range(n))
        self.sampler: DistributedSampler[int] | None = (
            DistributedSampler(indices, world, rank, shuffle=True, seed=spec.seed)
            if spec.sampler == "distributed"
            else None
        )
        self.per_epoch = (len(self.sampler) if self.sampler is not None else n) // spec.local_batch
        if self.per_epoch == 0:
            raise InvalidRequest(
                f"a rank's share of the {n} training samples does not fill one batch of "
                f"{spec.local_batch} (global_batch {spec.global_batch} / world_size {world})"
            )
        self.budget = int(
            min(
                spec.steps if spec.steps is not None else math.inf,
                spec.epochs * self.per_epoch if spec.epochs is not None else math.inf,
            )
        )
        self.epoch = step // self.per_epoch
        self._batch = step - self.epoch * self.per_epoch  # a resumed run's place
        self._order: Array | None = None
        self.entered = 0
        self.diagnostics: list[Diagnostic] = []

    def next(self) -> Array:
        if self._order is None or self._batch >= self.per_epoch:
            if self._order is not None:
                self.epoch += 1
                self._batch = 0
            self._order = self._epoch_order()
        b, size = self._batch, self.spec.local_batch
        self._batch += 1
        return self._order[b * size : (b + 1) * size]

    def _epoch_order(self) -> Array:
        spec = self.spec
        if self.sampler is not None:
            self.sampler.set_epoch(self.epoch)  # forget it and every epoch repeats one order
            order = np.fromiter(self.sampler, dtype=np.int64)
        else:
            # DataLoader(shuffle=True) seeded alike on every rank, as scripts seed
            # everything: every rank walks the same samples in the same order.
            order = np.random.default_rng(spec.seed + self.epoch).permutation(self.n)
        order = order[: self.per_epoch * spec.local_batch]  # drop_last: equal-sized batches
        step = self.epoch * self.per_epoch
        found = duplicate_samples(self.group, order, self.n, self.epoch, step)
        if found is not None and not any(d.code == DUPLICATE_SAMPLES for d in self.diagnostics):
            self.diagnostics.append(found)
        self.entered += 1
        return order


def _restore(params: Params, saved: Params, path: Path) -> None:
    """Copy checkpointed parameters into the model's arrays (torch's load_state_dict)."""
    if set(saved) != set(params):
        raise InvalidRequest(
            f"{path.name} holds parameters {sorted(saved)}, the model {sorted(params)}"
        )
    for name, p in params.items():
        if saved[name].shape != p.shape:
            raise InvalidRequest(
                f"{path.name}: {name} has shape {saved[name].shape}, the model {p.shape}"
            )
        p[...] = saved[name]


def device_of(rank: int) -> str:
    """The socket rank `rank` runs on when ranks fill a rack node by node."""
    return str(SocketId(rank // SOCKETS_PER_NODE, rank % SOCKETS_PER_NODE))


def train_threaded(
    spec: TrainSpec,
    checkpoint_dir: Path | None = None,
    timeout_s: float | None = None,
    platform: PlatformSpec | None = None,
    hbm_cap_bytes: int = 0,
) -> list[RankResult]:
    """Run `train` on every rank of an in-process ThreadGroup; results by rank. Each
    rank's memory is accounted on a socket of `platform` (default sn40l-rack16) of its
    own, under `hbm_cap_bytes` (0: the socket's HBM)."""
    socket = (platform or preset("sn40l-rack16")).socket
    group = ThreadGroup(spec.world_size, timeout_s or spec.timeout_s)

    def one(backend: Backend) -> RankResult:
        device = device_of(backend.rank)
        account = MemoryAccount(TieredMemory(device, socket), "train/", hbm_cap_bytes)
        ctx = RankContext(backend, backend.rank, device, checkpoint_dir, memory=account)
        try:
            return train(ctx, spec)
        finally:
            account.close()

    return group.run(one)
