"""SGD and Adam with torch.optim's update rules, on a model's parameter dict.

Both update the parameters in place (the model's own arrays), read gradients from a
dict with the same names, and keep their state per parameter name. The arithmetic
follows torch's single-tensor ("foreach=False") implementations, with hyperparameters as
Python floats so float32 parameters stay float32 (see arrays.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.arrays import Array, Params

# state_dict(): {"state": {param name: {buffer name: array}}, "param_groups": [hyper]}
StateDict = dict[str, Any]


class Optimizer:
    """What SGD and Adam share: the parameters, per-parameter state, state dicts."""

    defaults: dict[str, Any]

    def __init__(self, params: Params, defaults: dict[str, Any]) -> None:
        if not params:
            raise InvalidRequest("an optimizer needs at least one parameter")
        self.params = params  # the model's dict: updated in place
        self.defaults = dict(defaults)
        self.state: dict[str, dict[str, Array]] = {name: {} for name in params}

    def _check(self, grads: Mapping[str, Array]) -> None:
        missing = [n for n in self.params if n not in grads]
        extra = [n for n in grads if n not in self.params]
        if missing or extra:
            raise InvalidRequest(
                f"gradients do not match the parameters: missing {missing}, unknown {extra}"
            )
        for name, p in self.params.items():
            if grads[name].shape != p.shape:
                raise InvalidRequest(
                    f"gradient {name} has shape {grads[name].shape}, parameter {p.shape}"
                )

    def step(self, grads: Mapping[str, Array]) -> None:
        """One update of every parameter from `grads` (name -> gradient)."""
        self._check(grads)
        for name, p in self.params.items():
            self._update(name, p, grads[name], self.state[name])

    def _update(self, name: str, p: Array, g: Array, state: dict[str, Array]) -> None:
        raise NotImplementedError

    def state_bytes(self) -> int:
        """Bytes of the state arrays it holds now (none before the first step)."""
        return sum(a.nbytes for s in self.state.values() for a in s.values())

    def state_dict(self) -> StateDict:
        """A deep copy of the state and the hyperparameters (torch's layout, keyed by
        parameter name instead of index)."""
        return {
            "state": {n: {k: v.copy() for k, v in s.items()} for n, s in self.state.items()},
            "param_groups": [dict(self.defaults)],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state_dict() of an optimizer of the same kind over the same names."""
        state = state_dict.get("state")
        groups = state_dict.get("param_groups")
        if not isinstance(state, Mapping) or not isinstance(groups, list) or len(groups) != 1:
            raise InvalidRequest("not an optimizer state_dict: needs 'state' and 'param_groups'")
        if set(state) - set(self.params):
            raise InvalidRequest(
                f"optimizer state for unknown parameters: {sorted(set(state) - set(self.params))}"
            )
        if set(groups[0]) != set(self.defaults):
            raise InvalidRequest(
                f"{type(self).__name__} hyperparameters {sorted(self.defaults)} do not match "
                f"the state_dict's {sorted(groups[0])}"
            )
        restored: dict[str, dict[str, Array]] = {name: {} for name in self.params}
        for name, buffers in state.items():
            for key, value in buffers.items():
                arr = np.array(value, copy=True)
                if key != "step" and arr.shape != self.params[name].shape:
                    raise InvalidRequest(
                        f"optimizer state {name}.{key} has shape {arr.shape}, "
                        f"parameter {self.params[name].shape}"
                    )
                restored[name][key] = arr
        self.state = restored
        self.defaults = dict(groups[0])


class SGD(Optimizer):
    """torch.optim.SGD: weight decay added to the gradient, then momentum with torch's
    buffer rule (the first step's buffer is the gradient itself, later ones
    `momentum * buf + (1 - dampening) * g`), optionally Nesterov."""

    def __init__(
        self,
        params: Params,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise InvalidRequest(
                f"SGD: lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, "
                f"{weight_decay}"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise InvalidRequest("SGD: Nesterov momentum requires a momentum and zero dampening")
        super().__init__(
            params,
            {
                "lr": float(lr),
                "momentum": float(momentum),
                "weight_decay": float(weight_decay),
                "dampening": float(dampening),
                "nesterov": bool(nesterov),
            },
        )

    def _update(self, name: str, p: Array, g: Array, state: dict[str, Array]) -> None:
        h = self.defaults
        lr, momentum, wd = float(h["lr"]), float(h["momentum"]), float(h["weight_decay"])
        d = g + wd * p if wd else g
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = np.array(d, copy=True)
            else:
                buf *= momentum
                buf += (1.0 - float(h["dampening"])) * d
            d = d + momentum * buf if h["nesterov"] else buf
        p -= lr * d


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient, not AdamW):
    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
    p -= lr / (1 - b1^t) · m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise InvalidRequest(
                f"Adam: needs lr, eps, weight_decay >= 0 and betas in [0, 1), got lr={lr}, "
                f"betas={betas}, eps={eps}, weight_decay={weight_decay}"
            )
        super().__init__(
            params,
            {
                "lr": float(lr),
                "betas": (float(betas[0]), float(betas[1])),
                "eps": float(eps),
                "weight_decay": float(weight_decay),
            },
        )

    def _update(self, name: str, p: Array, g: Array, state: dict[str, Array]) -> None:
        h = self.defaults
        lr, eps, wd = float(h["lr"]), float(h["eps"]), float(h["weight_decay"])
        beta1, beta2 = (float(b) for b in h["betas"])
        if not state:
            state["step"] = np.array(0, dtype=np.int64)  # torch keeps step per parameter
            state["exp_avg"] = np.zeros_like(p)
            state["exp_avg_sq"] = np.zeros_like(p)
        state["step"] += 1
        t = int(state["step"])
        d = g + wd * p if wd else g
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1.0 - beta1) * d
        v *= beta2
        v += (1.0 - beta2) * (d * d)
        step_size = lr / (1.0 - beta1**t)
        denom = np.sqrt(v) / math.sqrt(1.0 - beta2**t) + eps
        p -= step_size * (m / denom)
