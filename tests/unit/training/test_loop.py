"""The reference training loop, every rank on a thread, its gradients averaged by torch's
DistributedDataParallel over the loop's process group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.backend import Backend, ThreadGroup
from rdurack.workloads.training.checkpoint import load
from rdurack.workloads.training.data import digits, synthetic
from rdurack.workloads.training.loop import train, train_threaded
from rdurack.workloads.training.rank import (
    DUPLICATE_SAMPLES,
    REPLICAS_DIFFER,
    RankContext,
    TrainSpec,
)


def _assert_same_params(a: dict[str, np.ndarray], b: dict[str, np.ndarray], tol: float) -> None:
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=tol, atol=tol, err_msg=name)


def test_digits_mlp_learns() -> None:
    spec = TrainSpec(model="mlp", world_size=2, global_batch=64, epochs=4, lr=0.1)
    results = train_threaded(spec)
    assert results[0].test_accuracy is not None and results[0].test_accuracy > 0.90
    assert results[1].test_accuracy is None  # evaluated on rank 0 only
    assert results[0].losses[-1] < results[0].losses[0]
    assert all(r.diagnostics == [] for r in results)
    # 1348 training digits, 674 per rank, 21 batches of 32 per epoch.
    assert [r.samples_seen for r in results] == [4 * 21 * 32] * 2
    assert results[0].device == "rdu-n0-s0" and results[1].device == "rdu-n0-s1"


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_train_exactly_as_one_process(world: int) -> None:
    """Shards of the sampler, batch by batch, are the global batches of one process;
    input noise is drawn for the global batch, so it matches too."""
    base = {"global_batch": 64, "steps": 8, "input_noise": 0.05, "seed": 3}
    single = train_threaded(TrainSpec(world_size=1, **base))[0]
    ranks = train_threaded(TrainSpec(world_size=world, **base))
    for r in ranks:
        _assert_same_params(r.params, single.params, 1e-5)
    # The mean of the ranks' local losses is the global batch's loss.
    mean_loss = np.mean([r.losses for r in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, single.losses, rtol=1e-5)


def test_transformer_with_adam_trains() -> None:
    spec = TrainSpec(
        model="transformer", optimizer="adam", lr=3e-3, world_size=2, global_batch=64, epochs=2
    )
    result = train_threaded(spec)[0]
    assert result.test_accuracy is not None and result.test_accuracy > 0.5
    assert result.losses[-1] < result.losses[0]


def test_synthetic_dataset() -> None:
    split = synthetic(100, 8, 3, seed=1)
    assert len(split.train.y) + len(split.test.y) == 100
    assert split.train.x.dtype == np.float32 and split.train.y.dtype == np.int64
    a, b = digits(seed=4), digits(seed=4)
    assert np.array_equal(a.test.y, b.test.y) and a.train.x.max() <= 1.0
    spec = TrainSpec(
        dataset="synthetic", synthetic_samples=400, synthetic_features=16,
        synthetic_classes=4, world_size=2, global_batch=20, epochs=3,
    )  # fmt: skip
    assert (train_threaded(spec)[0].test_accuracy or 0.0) > 0.8


def test_no_broadcast_diverges_and_is_diagnosed() -> None:
    spec = TrainSpec(world_size=2, global_batch=32, steps=5, broadcast_parameters=False)
    results = train_threaded(spec)
    assert not np.allclose(
        results[0].params["layers.0.weight"], results[1].params["layers.0.weight"]
    )
    for r in results:
        (d,) = r.diagnostics
        assert d.code == REPLICAS_DIFFER and "broadcast from rank 0 is off" in d.message


def test_no_distributed_sampler_is_diagnosed() -> None:
    spec = TrainSpec(world_size=2, global_batch=32, steps=5, sampler="none")
    results = train_threaded(spec)
    for r in results:
        (d,) = r.diagnostics
        assert d.code == DUPLICATE_SAMPLES and "no DistributedSampler" in d.message
        # Both ranks walk the same 1344 samples of the epoch.
        assert d.data["repeats"] == d.data["distinct"] == 1344
    # With the sampler, the only repeats are torch's padding (none here): no diagnostic.
    ok = train_threaded(spec.model_copy(update={"sampler": "distributed"}))
    assert all(r.diagnostics == [] for r in ok)


def test_wrong_world_size_or_rank_is_refused() -> None:
    spec = TrainSpec(world_size=3, global_batch=30, steps=1)
    group = ThreadGroup(2, timeout_s=10)
    with pytest.raises(InvalidRequest, match=r"rank \d of world_size 3, but the process group"):
        group.run(lambda b: train(RankContext(b, b.rank, f"rdu-n0-s{b.rank}"), spec))

    def swapped(b: Backend) -> object:
        return train(RankContext(b, 1 - b.rank, f"rdu-n0-s{b.rank}"), spec2)

    spec2 = TrainSpec(world_size=2, global_batch=32, steps=1)
    with pytest.raises(
        InvalidRequest, match=r"rank 1 of world_size 2, but the process group holds"
    ):
        ThreadGroup(2, timeout_s=10).run(swapped)


def test_global_batch_must_split_evenly() -> None:
    with pytest.raises(ValidationError, match="global_batch 30 is not divisible by world_size 4"):
        TrainSpec(world_size=4, global_batch=30, steps=1)
    with pytest.raises(ValidationError, match="epochs or steps"):
        TrainSpec(world_size=1, global_batch=8)


def test_only_rank_0_checkpoints_and_resume_continues_identically(tmp_path: Path) -> None:
    base = {
        "world_size": 2, "global_batch": 32, "optimizer": "adam", "lr": 0.01,
        "input_noise": 0.1, "checkpoint_every": 10,
    }  # fmt: skip
    # 674 samples per rank in batches of 16: 42 steps per epoch, so 50 cross into epoch 1.
    full = train_threaded(TrainSpec(steps=50, **base), tmp_path / "full")
    assert [Path(p).name for p in full[0].checkpoints] == [
        f"ckpt-{s:08d}.pt" for s in (10, 20, 30, 40, 50)
    ]
    assert full[1].checkpoints == []  # rank 1 wrote nothing
    assert load(full[0].checkpoints[-1], device="rdu-n0-s0").step == 50

    run_dir = tmp_path / "interrupted"
    first = train_threaded(TrainSpec(steps=30, **base), run_dir)
    assert first[0].steps == 30
    resumed = train_threaded(TrainSpec(steps=50, resume=True, **base), run_dir)
    for r, f in zip(resumed, full, strict=True):
        assert r.start_step == 30 and r.steps == 50
        assert r.losses == f.losses[30:]  # the same batches, noise and updates
        _assert_same_params(r.params, f.params, 0.0)
