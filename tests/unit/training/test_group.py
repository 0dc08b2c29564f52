"""The built-in loop's process group: torch's own DistributedDataParallel over a
`Backend`, its buckets as the timing model lays them out, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from rdurack.errors import LinkFailure
from rdurack.workloads.training.backend import Backend, ReduceOpName, ThreadGroup
from rdurack.workloads.training.data import Array, synthetic
from rdurack.workloads.training.group import BackendGroup, all_gather, broadcast
from rdurack.workloads.training.models import ModelName, Trainable, build_model
from rdurack.workloads.training.scaling import Bucket, assign_buckets

STEPS = 6
GLOBAL_BATCH = 32
KIB = 1024


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
    model = Trainable(build_model("mlp", 64, 10, 0, 64, 1))
    (only,) = assign_buckets([(n, p.size, p.itemsize) for n, p in model.params.items()])
    assert only.params == ("layers.1.bias", "layers.1.weight", "layers.0.bias", "layers.0.weight")
    assert only.nbytes == 4 * sum(p.size for p in model.params.values())


class Counting:
    """A Backend that counts all-reduces and their bytes (what DDP's buckets are)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.all_reduced: list[int] = []

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size

    def set_timeout(self, timeout_s: float) -> None:
        self.inner.set_timeout(timeout_s)

    def all_reduce(self, array: Array, op: ReduceOpName = "sum") -> None:
        self.all_reduced.append(array.nbytes)
        self.inner.all_reduce(array, op)

    def broadcast(self, array: Array, src: int) -> None:
        self.inner.broadcast(array, src)

    def all_gather(self, array: Array) -> list[Array]:
        return self.inner.all_gather(array)

    def barrier(self) -> None:
        self.inner.barrier()


def test_torchs_buckets_are_the_ones_the_timing_model_prices() -> None:
    """After its first step (one bucket of everything), torch DDP all-reduces the
    buckets `assign_buckets` lays out: the same count and bytes, in the same order."""
    cap = 256 * KIB
    x = torch.from_numpy(synthetic(64, 64, 10, seed=0).train.x[:8])

    def rank_body(b: Backend) -> tuple[list[int], list[int]]:
        counting = Counting(b)
        model = Trainable(build_model("mlp", 64, 10, 0, 512, 2))  # 1.2 MB of parameters
        ddp = DistributedDataParallel(
            model.net, process_group=BackendGroup(counting), bucket_cap_mb=cap / KIB / KIB
        )
        per_step = []
        for _ in range(3):
            counting.all_reduced.clear()
            ddp(x).sum().backward()
            per_step.append(list(counting.all_reduced))
        sizes = [(n, p.size, p.itemsize) for n, p in model.params.items()]
        return per_step[-1], [bk.nbytes for bk in assign_buckets(sizes, cap)]

    for torch_buckets, priced in ThreadGroup(2, timeout_s=30).run(rank_body):
        assert len(priced) >= 2 and torch_buckets == priced


def _model(name: ModelName, seed: int, dtype: type) -> Trainable:
    net = build_model(name, 64, 10, seed=seed)
    return Trainable(net.double() if dtype == np.float64 else net)


def _optimizer(kind: str, model: Trainable) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.trained, lr=0.1, momentum=0.9, weight_decay=1e-4)
    return torch.optim.Adam(model.trained, lr=0.01)


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
        # Different seeds per rank: DDP's broadcast from rank 0 must make them agree.
        model = _model(model_name, b.rank, dtype)
        ddp = DistributedDataParallel(model.net, process_group=BackendGroup(b), bucket_cap_mb=0.004)
        local_opt = _optimizer(kind, model)
        for s in range(STEPS):
            x, y = batches(s)
            model.forward(x[b.rank :: world], y[b.rank :: world], ddp)  # an equal shard each
            model.backward()
            local_opt.step()
        return model.params

    replicas = ThreadGroup(world, timeout_s=30).run(rank_body)
    for params in replicas:
        for name, p in params.items():
            np.testing.assert_allclose(p, reference.params[name], rtol=1e-5, atol=1e-5)
            assert np.array_equal(p, replicas[0][name])  # replicas are bitwise identical


def test_a_failed_gradient_all_reduce_raises_from_backward() -> None:
    """Rank 1 never runs backward: rank 0's bucket all-reduce times out inside
    `loss.backward()`, and the error reaches the caller there, named."""
    x = torch.ones(4, 8)

    def rank_body(b: Backend) -> str:
        model = Trainable(build_model("mlp", 8, 2, 0, 4, 1))
        ddp = DistributedDataParallel(model.net, process_group=BackendGroup(b))
        if b.rank == 1:
            return "skipped"
        loss = ddp(x).sum()
        with pytest.raises(LinkFailure, match="rank 1 never arrived") as caught:
            loss.backward()
        return type(caught.value).__name__

    assert ThreadGroup(2, timeout_s=1).run(rank_body) == ["CollectiveTimeout", "skipped"]


def test_the_loops_own_calls_reach_every_rank() -> None:
    def rank_body(b: Backend) -> tuple[float, list[float]]:
        group = BackendGroup(b)
        flag = torch.tensor([float(b.rank + 5)])
        broadcast(group, flag, src=1)
        return float(flag[0]), [float(t[0]) for t in all_gather(group, torch.tensor([b.rank]))]

    assert ThreadGroup(3, timeout_s=30).run(rank_body) == [(6.0, [0.0, 1.0, 2.0])] * 3
