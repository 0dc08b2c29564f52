"""Backward passes checked against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from rdurack.workloads.training.models import Model

EPS = 1e-6  # central-difference step


def grad_check(model: Model, x: np.ndarray, y: np.ndarray, per_param: int = 12) -> None:
    """Compare backward() with (L(p+h) - L(p-h)) / 2h on sampled entries of every
    parameter."""
    model.forward(x, y)
    model.backward()
    analytic = {name: g.copy() for name, g in model.grads.items()}
    pick = np.random.default_rng(0)
    for name, p in model.params.items():
        flat = p.reshape(-1)  # a view: perturbs the parameter itself
        for i in pick.choice(p.size, size=min(p.size, per_param), replace=False):
            old = flat[i]
            flat[i] = old + EPS
            up = model.forward(x, y)
            flat[i] = old - EPS
            down = model.forward(x, y)
            flat[i] = old
            numeric = (up - down) / (2 * EPS)
            assert analytic[name].reshape(-1)[i] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (
                f"{name}[{i}]"
            )
