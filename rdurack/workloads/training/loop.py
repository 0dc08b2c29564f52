"""The reference training loop: what a torch DDP script does, rank by rank.

`train(ctx, spec)` runs on every rank of a job. In order, as a user writes it:
init_process_group; build the data and the model (each process initialises its own
replica); optionally resume from the newest checkpoint with map_location set to the
rank's own socket; wrap the model in DistributedDataParallel; per epoch,
DistributedSampler.set_epoch and batches of global_batch / world_size samples;
forward, backward (gradients averaged over ranks), optimizer step; a checkpoint by
rank 0 every `checkpoint_every` steps; test accuracy on rank 0 at the end;
destroy_process_group.

Two of the article's mistakes can be switched on to see them diagnosed:
`broadcast_parameters=False` (replicas start from their own random parameters and never
agree) and `sampler="none"` (a loader without DistributedSampler: every rank walks the
whole dataset in the same order, so the ranks process the same samples).

The strategy (progressive.py) sets the stages: `full` trains the whole model in one
stage; `progressive` (ProFL) trains an MLP block by block, shrinking then growing, each
block until its effective movement (movement.py) says it has converged or its stage's
step budget (`steps` / `epochs`, per stage) is spent. Data order runs on across stages
(the sampler's epochs continue). A `MemoryAccount` in the context mirrors what the rank
holds, stage by stage, on its socket's tiers (memory.py).

`train_threaded(spec)` runs every rank on a thread of a `ThreadGroup`; the cluster runs
`train` in each socket actor over its gRPC links instead.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from rdurack.errors import InvalidRequest
from rdurack.rack.memory import TieredMemory
from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.arrays import Array, Params, copy_params
from rdurack.workloads.training.backend import Backend, ThreadGroup
from rdurack.workloads.training.checkpoint import (
    TrainingState,
    latest,
    load,
    save,
    state_bytes,
)
from rdurack.workloads.training.data import Dataset as Samples
from rdurack.workloads.training.data import load_data
from rdurack.workloads.training.ddp import (
    DistributedDataParallel,
    broadcast_parameters,
)
from rdurack.workloads.training.diagnostics import DUPLICATE_SAMPLES, Diagnostic
from rdurack.workloads.training.distributed import (
    Distributed,
)
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.models import Model, Trainable, optimizer_bytes
from rdurack.workloads.training.movement import (
    EffectiveMovement,
)
from rdurack.workloads.training.progressive import StageReport
from rdurack.workloads.training.rank import (
    CheckpointEvent,
    RankContext,
    RankResult,
    StageEvent,
    StepInfo,
    TrainSpec,
)
from rdurack.workloads.training.strategy import Trainee

SOCKETS_PER_NODE = 8  # SN40L node: rank r runs on socket r % 8 of node r // 8


def make_optimizer(spec: TrainSpec, model: Trainable) -> torch.optim.Optimizer:
    """torch.optim's SGD or Adam over what `model` trains."""
    if spec.optimizer == "sgd":
        return torch.optim.SGD(
            model.trained, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    return torch.optim.Adam(model.trained, lr=spec.lr, weight_decay=spec.weight_decay)


def accuracy(model: Model, data: Samples) -> float:
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
    dist = Distributed(ctx.transport)
    dist.init_process_group(
        "rdulink",
        world_size=spec.world_size,
        rank=ctx.rank,
        timeout=timedelta(seconds=spec.timeout_s),
    )
    try:
        return (yield from _train(dist, ctx, spec))
    finally:
        dist.destroy_process_group()


def _train(
    dist: Distributed, ctx: RankContext, spec: TrainSpec
) -> Generator[StepInfo, None, RankResult]:
    rank, world = dist.get_rank(), dist.get_world_size()
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
    _check_same_start(dist, step)
    if spec.strategy != "full" and spec.broadcast_parameters:
        # Every block and output module, once: a stage's DDP sees only what it trains.
        broadcast_parameters(dist, trainee.params)

    n = len(train_set.y)
    batches = _Batches(dist, spec, n, step)
    budget = batches.budget  # steps per stage
    total = budget * len(trainee.stages)
    account = ctx.memory
    losses: list[float] = []
    diagnostics: list[Diagnostic] = []
    written: list[str] = []
    reports: list[StageReport] = []
    samples = 0
    bucket_bytes: list[int] = []
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
        ddp = DistributedDataParallel(
            ctx.wrap(model) if ctx.wrap is not None else model,
            dist,
            bucket_cap_bytes=spec.bucket_cap_bytes,
            # Progressive: every parameter was broadcast above.
            broadcast_parameters=spec.broadcast_parameters and stage.block is None,
            check_every=spec.check_every,
        )
        began = step
        # Full training counts its budget from step 0 (a resumed run finishes it); a
        # progressive stage from its own start.
        end = budget if stage.block is None else began + budget
        converged = False
        while step < end and not converged:
            idx = batches.next()
            x, y = train_set.x[idx], train_set.y[idx]
            if spec.input_noise:
                noise = rng.standard_normal((spec.global_batch, x.shape[1]), dtype=np.float32)
                # Rank r's row k is row r + k * world of the global batch.
                x = x + noise[rank::world] * float(spec.input_noise)
            losses.append(ddp.forward(x, y))
            if account is not None:
                account.hold("activations", Tier.HBM, model.saved_bytes())
            ddp.backward()
            if account is not None:
                account.release("activations")  # backward is done with them
            optimizer.step()
            if account is not None:
                account.hold("optimizer", Tier.HBM, optimizer_bytes(optimizer))
            samples += len(idx)
            step += 1
            window = movement.update() if movement is not None else None
            if movement is not None and window is not None:  # a window ended, on every rank
                converged = _agree(dist, movement.converged(window))
            yield StepInfo(step, total, losses[-1], stage.name)
            if spec.checkpoint_every and step % spec.checkpoint_every == 0:
                if ctx.checkpoint_dir is not None and dist.get_rank() == 0:
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
                dist.barrier()  # as torch's tutorial: nobody reads a half-written file
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
        diagnostics += [d for d in ddp.diagnostics if d not in diagnostics]
        bucket_bytes = ddp.bucket_bytes
    diagnostics = diagnostics + batches.diagnostics
    test_acc = accuracy(trainee.model, test_set) if rank == 0 else None
    dist.barrier()
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
        bucket_bytes=bucket_bytes,
        checkpoints=written,
        params=copy_params(trainee.params),
        stages=reports,
        peak_bytes=dict(account.peaks) if account is not None else {},
    )


def _agree(dist: Distributed, mine: bool) -> bool:
    """Rank 0's decision, on every rank (one tiny broadcast): replicas that drifted
    apart (no initial broadcast) must still end a stage at the same step."""
    flag = np.array([1.0 if mine else 0.0], dtype=np.float32)
    dist.broadcast(flag, src=0)
    return bool(flag[0])


class _Batches:
    """This rank's sample indices, batch after batch, epoch after epoch: the
    DistributedSampler's shard (or, with `sampler: none`, the whole dataset), drop_last.
    At each epoch's start the ranks compare their indices (duplicate samples)."""

    def __init__(self, dist: Distributed, spec: TrainSpec, n: int, step: int) -> None:
        self.dist, self.spec, self.n = dist, spec, n
        world, rank = dist.get_world_size(), dist.get_rank()
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
        found = _duplicates(self.dist, order, self.n, self.epoch, self.epoch * self.per_epoch)
        if found is not None and not any(d.code == DUPLICATE_SAMPLES for d in self.diagnostics):
            self.diagnostics.append(found)
        self.entered += 1
        return order


def _check_same_start(dist: Distributed, step: int) -> None:
    """Every rank must resume at the same step: a checkpoint directory that only some
    ranks see (storage not shared across nodes) would desynchronise their collectives."""
    steps = [np.zeros(1, dtype=np.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, np.array([step], dtype=np.int64))
    found = [int(s[0]) for s in steps]
    if len(set(found)) > 1:
        raise InvalidRequest(
            f"ranks resumed at different steps {found}: the checkpoint directory is not "
            "shared by every rank; put it on storage every node sees"
        )


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


def _duplicates(
    dist: Distributed, order: Array, n: int, epoch: int, step: int
) -> Diagnostic | None:
    """All ranks compare this epoch's sample indices (one all-gather): more repeats
    than DistributedSampler's padding (< world_size) mean ranks share samples."""
    world = dist.get_world_size()
    gathered = [np.empty_like(order) for _ in range(world)]
    dist.all_gather(gathered, order)
    everything = np.concatenate(gathered)
    distinct = len(np.unique(everything))
    repeats = len(everything) - distinct
    if repeats < world:
        return None
    return Diagnostic(
        DUPLICATE_SAMPLES,
        f"ranks processed duplicate samples: {repeats} of the {len(everything)} samples "
        f"of epoch {epoch} were also processed by another rank ({distinct} distinct of "
        f"{n}); the data loader has no DistributedSampler, so every rank walks the whole "
        "dataset",
        step,
        {"epoch": epoch, "repeats": repeats, "samples": len(everything), "distinct": distinct},
    )


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
