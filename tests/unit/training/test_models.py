"""Hand-written backward passes against central differences, in float64."""

from __future__ import annotations

import numpy as np
import pytest

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.models import (
    MLP,
    ModelName,
    TransformerClassifier,
    build_model,
    softmax_cross_entropy,
)
from tests.support.grad_check import grad_check


def _batch(n: int = 6, features: int = 64, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.random((n, features)), rng.integers(0, classes, n)


def test_mlp_gradients_match_finite_differences() -> None:
    x, y = _batch()
    grad_check(MLP([64, 16, 12, 10], seed=3, dtype=np.float64), x, y)


def test_transformer_gradients_match_finite_differences() -> None:
    x, y = _batch()
    model = TransformerClassifier(d_model=16, heads=4, mlp_hidden=24, seed=3, dtype=np.float64)
    # Move LayerNorm scales/shifts and positions off their init values (1, 0, ~0) so the
    # check exercises general values.
    rng = np.random.default_rng(2)
    for p in model.params.values():
        p += rng.normal(0.0, 0.2, p.shape)
    grad_check(model, x, y)


def test_cross_entropy_gradient_and_value() -> None:
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    loss, d = softmax_cross_entropy(logits, np.array([0, 2]))
    p0 = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert loss == pytest.approx((-np.log(p0[0]) + np.log(3.0)) / 2)
    assert d.sum(axis=1) == pytest.approx([0.0, 0.0])  # softmax minus one-hot


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_float32_training_stays_float32(name: ModelName) -> None:
    """numpy 2 upcasts float32 by float64 scalars; forward and backward must not."""
    x, y = _batch()
    model = build_model(name, 64, 10)  # float32
    assert model.logits(x).dtype == np.float32
    model.forward(x.astype(np.float32), y)
    model.backward()  # gradients are copied with casting="no": an upcast would raise
    assert all(g.dtype == np.float32 for g in model.grads.values())


def test_parameters_keep_definition_order_and_torch_names() -> None:
    assert list(MLP([4, 3, 2]).params) == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
    ]
    assert MLP([4, 3, 2]).params["layers.0.weight"].shape == (3, 4)  # torch: (out, in)
    names = list(TransformerClassifier().params)
    assert names[0] == "embed.weight" and names[-1] == "head.bias"


def test_same_seed_same_parameters_and_bad_sizes_refused() -> None:
    a, b = MLP([8, 4, 2], seed=5), MLP([8, 4, 2], seed=5)
    assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params)
    with pytest.raises(InvalidRequest, match="heads"):
        TransformerClassifier(d_model=10, heads=4)
    with pytest.raises(InvalidRequest, match="tokens"):
        build_model("transformer", 60, 10)
    with pytest.raises(InvalidRequest, match=r"expected \(batch, 4\)"):
        MLP([4, 2]).logits(np.zeros((2, 5)))
