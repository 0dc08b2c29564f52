"""DistributedDataParallel: buckets, and N ranks equal one process on the global batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rdurack.workloads.training.backend import Backend, ThreadGroup
from rdurack.workloads.training.data import synthetic
from rdurack.workloads.training.ddp import Bucket, DistributedDataParallel, assign_buckets
from rdurack.workloads.training.diagnostics import REPLICAS_DIFFER
from rdurack.workloads.training.distributed import Distributed, NotInitialized
from rdurack.workloads.training.models import ModelName, Trainable, build_model

STEPS = 6
GLOBAL_BATCH = 32


def test_buckets_follow_torchs_rule() -> None:
    sizes = [("a", 100, 4), ("b", 300, 4), ("c", 200, 4), ("d", 50, 4)]
    buckets = assign_buckets(sizes, bucket_cap_bytes=1000, first_bucket_cap_bytes=500)
    # Reverse definition order; a bucket closes once it reaches its limit (it may
    # overshoot by one tensor); the first one's limit is the small one.
    assert buckets == [
        Bucket(0, ("d", "c"), 250, 1000),
        Bucket(1, ("b",), 300, 1200),
        Bucket(2, ("a",), 100, 400),
    ]
    # torch's defaults (1 MiB first, 25 MiB after) put a small model in one bucket.
    model = _mlp([64, 64, 10])
    (only,) = assign_buckets([(n, p.size, p.itemsize) for n, p in model.params.items()])
    assert only.params == ("layers.1.bias", "layers.1.weight", "layers.0.bias", "layers.0.weight")
    assert only.nbytes == 4 * sum(p.size for p in model.params.values())


def _mlp(sizes: list[int], seed: int = 0) -> Trainable:
    hidden = sizes[1:-1]
    return Trainable(build_model("mlp", sizes[0], sizes[-1], seed, hidden[0], len(hidden)))


def _model(name: ModelName, seed: int, dtype: type) -> Trainable:
    net = build_model(name, 64, 10, seed=seed)
    return Trainable(net.double() if dtype == np.float64 else net)


def _optimizer(kind: str, model: Trainable) -> torch.optim.Optimizer:
    return (
        torch.optim.SGD(model.trained, lr=0.1, momentum=0.9, weight_decay=1e-4)
        if kind == "sgd"
        else (torch.optim.Adam(model.trained, lr=0.01))
    )


# SGD in float32, the training dtype. Adam divides by sqrt(v): for near-zero gradients
# it turns float32 rounding (sum of rank means vs one global mean) into visible
# differences, so its equivalence is checked in float64, where rounding stays small.
@pytest.mark.parametrize(("kind", "dtype"), [("sgd", np.float32), ("adam", np.float64)])
@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
@pytest.mark.parametrize("world", [2, 4])
def test_ddp_equals_single_process_on_the_global_batch(
    world: int, model_name: ModelName, kind: str, dtype: type
) -> None:
    data = synthetic(400, 64, 10, seed=1).train

    def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
        lo = step * GLOBAL_BATCH
        return data.x[lo : lo + GLOBAL_BATCH], data.y[lo : lo + GLOBAL_BATCH]

    reference = _model(model_name, 0, dtype)
    opt = _optimizer(kind, reference)
    for s in range(STEPS):
        reference.forward(*batches(s))
        reference.backward()
        opt.step()

    def rank_body(b: Backend) -> dict[str, np.ndarray]:
        dist = Distributed(b)
        dist.init_process_group("rdulink", world_size=world, rank=b.rank)
        # Different seeds per rank: the broadcast from rank 0 must make them agree.
        model = _model(model_name, b.rank, dtype)
        ddp = DistributedDataParallel(
            model, dist, bucket_cap_bytes=4096, first_bucket_cap_bytes=512
        )
        assert len(ddp.buckets) >= 2 and sum(ddp.bucket_bytes) == sum(
            p.nbytes for p in model.params.values()
        )
        local_opt = _optimizer(kind, model)
        for s in range(STEPS):
            x, y = batches(s)
            ddp.forward(x[b.rank :: world], y[b.rank :: world])  # an equal shard each
            ddp.backward()
            local_opt.step()
        assert ddp.diagnostics == []
        return model.params

    replicas = ThreadGroup(world, timeout_s=30).run(rank_body)
    for params in replicas:
        for name, p in params.items():
            np.testing.assert_allclose(p, reference.params[name], rtol=1e-5, atol=1e-5)
            assert np.array_equal(p, replicas[0][name])  # replicas are bitwise identical


def test_without_broadcast_replicas_differ_and_are_diagnosed() -> None:
    data = synthetic(200, 16, 3, seed=2).train

    def rank_body(b: Backend) -> tuple[DistributedDataParallel, dict[str, np.ndarray]]:
        dist = Distributed(b)
        dist.init_process_group("rdulink", world_size=2, rank=b.rank)
        model = _mlp([16, 8, 3], seed=100 + b.rank)
        ddp = DistributedDataParallel(model, dist, broadcast_parameters=False, check_every=2)
        opt = torch.optim.SGD(model.trained, lr=0.1)
        for s in range(4):
            lo = 16 * s + 8 * b.rank
            ddp.forward(data.x[lo : lo + 8], data.y[lo : lo + 8])
            ddp.backward()
            opt.step()
        return ddp, model.params

    (ddp0, p0), (ddp1, p1) = ThreadGroup(2, timeout_s=30).run(rank_body)
    assert not np.allclose(p0["layers.0.weight"], p1["layers.0.weight"])
    for ddp in (ddp0, ddp1):
        first = ddp.diagnostics[0]
        assert first.code == REPLICAS_DIFFER and first.step == 0
        assert "replicas started from different parameters: broadcast from rank 0 is off" in (
            first.message
        )
        assert first.data["max_abs_diff"] > 0.01 and first.data["ranks"] == [1]
        # The periodic check (check_every=2: before the third step) sees them apart too.
        assert [d.step for d in ddp.diagnostics] == [0, 2]
        assert "diverged by step 2" in ddp.diagnostics[1].message


def test_identical_replicas_pass_the_check() -> None:
    def rank_body(b: Backend) -> float:
        dist = Distributed(b)
        dist.init_process_group("rdulink", world_size=3, rank=b.rank)
        ddp = DistributedDataParallel(_mlp([8, 4, 2], seed=b.rank), dist)
        return ddp.check_replicas()

    assert ThreadGroup(3, timeout_s=30).run(rank_body) == [0.0, 0.0, 0.0]


def test_ddp_needs_an_initialized_process_group() -> None:
    with pytest.raises(NotInitialized, match="init_process_group"):
        DistributedDataParallel(_mlp([4, 3, 2]), Distributed(ThreadGroup(1).backend(0)))
