"""SGD and Adam against hand-computed torch-rule updates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.optim import SGD, Adam

GRADS = [[0.5, 0.1], [-0.2, 0.3], [0.1, -0.4]]


def test_sgd_momentum_and_weight_decay_follow_torch() -> None:
    p = {"w": np.array([1.0, -2.0])}
    opt = SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)
    opt.step({"w": np.array(GRADS[0])})
    # torch: d = g + wd·p = 0.5 + 0.01 = 0.51; first step buf = d; p = 1 - 0.1·0.51
    assert p["w"][0] == pytest.approx(0.949, abs=1e-12)
    opt.step({"w": np.array(GRADS[1])})
    # d = -0.2 + 0.01·0.949 = -0.19051; buf = 0.9·0.51 + d = 0.26849; p = 0.949 - 0.026849
    assert p["w"][0] == pytest.approx(0.922151, abs=1e-12)
    # The rule, element by element, for the third step too.
    q = [1.0, -2.0]
    buf: list[float] = []
    for t, g in enumerate(GRADS):
        d = [gi + 0.01 * qi for gi, qi in zip(g, q, strict=True)]
        buf = d if t == 0 else [0.9 * b + di for b, di in zip(buf, d, strict=True)]
        q = [qi - 0.1 * b for qi, b in zip(q, buf, strict=True)]
    opt.step({"w": np.array(GRADS[2])})
    assert p["w"] == pytest.approx(q, abs=1e-12)


def test_plain_sgd_keeps_no_state() -> None:
    p = {"w": np.array([1.0])}
    opt = SGD(p, lr=0.5)
    opt.step({"w": np.array([2.0])})
    assert p["w"][0] == 0.0 and opt.state == {"w": {}}


def test_adam_bias_correction_follows_torch() -> None:
    p = {"w": np.array([1.0, -2.0])}
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-8, 0.01
    opt = Adam(p, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    opt.step({"w": np.array([0.5, 0.0])})
    # First step: bias correction makes the update lr·g/(|g| + eps'), about lr·sign(g).
    assert p["w"][0] == pytest.approx(1.0 - 0.1, abs=1e-7)
    q, m, v = [1.0, -2.0], [0.0, 0.0], [0.0, 0.0]
    g0 = [0.5 + wd * 1.0, 0.0 + wd * -2.0]
    m = [(1 - b1) * g for g in g0]
    v = [(1 - b2) * g * g for g in g0]
    q = [qi - lr / (1 - b1) * mi / (math.sqrt(vi) / math.sqrt(1 - b2) + eps)
         for qi, mi, vi in zip(q, m, v, strict=True)]  # fmt: skip
    for t, g in enumerate(GRADS[1:], start=2):
        d = [gi + wd * qi for gi, qi in zip(g, q, strict=True)]
        m = [b1 * mi + (1 - b1) * di for mi, di in zip(m, d, strict=True)]
        v = [b2 * vi + (1 - b2) * di * di for vi, di in zip(v, d, strict=True)]
        step = lr / (1 - b1**t)
        q = [qi - step * mi / (math.sqrt(vi) / math.sqrt(1 - b2**t) + eps)
             for qi, mi, vi in zip(q, m, v, strict=True)]  # fmt: skip
        opt.step({"w": np.array(g)})
        assert p["w"] == pytest.approx(q, abs=1e-12)
    assert int(opt.state["w"]["step"]) == 3


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_state_dict_round_trip_continues_identically(kind: str) -> None:
    def make(params: dict[str, np.ndarray]) -> SGD | Adam:
        return SGD(params, 0.1, momentum=0.9) if kind == "sgd" else Adam(params, 0.01)

    a = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    opt_a = make(a)
    for g in GRADS[:2]:
        opt_a.step({"w": np.array(g, dtype=np.float32)})
    b = {"w": a["w"].copy()}
    opt_b = make(b)
    opt_b.load_state_dict(opt_a.state_dict())
    opt_a.step({"w": np.array(GRADS[2], dtype=np.float32)})
    opt_b.step({"w": np.array(GRADS[2], dtype=np.float32)})
    assert np.array_equal(a["w"], b["w"]) and a["w"].dtype == np.float32


def test_mismatched_gradients_and_bad_hyperparameters_are_refused() -> None:
    opt = SGD({"w": np.zeros(2)}, lr=0.1)
    with pytest.raises(InvalidRequest, match="missing"):
        opt.step({"v": np.zeros(2)})
    with pytest.raises(InvalidRequest, match="shape"):
        opt.step({"w": np.zeros(3)})
    with pytest.raises(InvalidRequest, match="betas"):
        Adam({"w": np.zeros(1)}, betas=(0.9, 1.0))
    with pytest.raises(InvalidRequest, match="hyperparameters"):
        Adam({"w": np.zeros(2)}).load_state_dict(opt.state_dict())
