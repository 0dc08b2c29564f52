"""When a block has converged: the effective movement of its parameters over a window.

ProFL freezes a block once "a scalar metric" says it has learned what it can (Wu, Li,
Xu, arXiv 2404.13349, abstract); the paper's formula is not public, so this one is
ours. Over a window of W optimizer steps k = 1..W, with Δ_kj = θ_kj − θ_(k−1)j the
update of scalar parameter j:

    m_j = |Σ_k Δ_kj| / Σ_k |Δ_kj|        (0 <= m_j <= 1; m_j = 0 if j did not move)

    movement = mean of m_j over the block's scalars

m_j is 1 when every step moved j the same way (still descending) and falls when its
steps cancel (it oscillates around a minimum under gradient noise; for independent
steps E[m_j] ≈ 1/√W). Windows tumble: one value every W steps. The block freezes at
the end of the first window whose movement is below the threshold.

Memory: m_j is tracked on a fixed, seeded sample of at most `sample` of the block's
scalars (all of them in a smaller block): the sample mean estimates the block's mean,
and the metric holds 3 float64 values and one index per sampled scalar instead of
copies of the whole block. `nbytes` is what it holds (accounted as "movement").
"""

from __future__ import annotations

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.arrays import Array, Params

DEFAULT_WINDOW_STEPS = 25
DEFAULT_THRESHOLD = 0.45
DEFAULT_SAMPLE = 256  # scalars per block the metric follows


class EffectiveMovement:
    """The movement of the parameters `params` (name -> array, updated in place by the
    optimizer), one value per completed window of `window` steps."""

    def __init__(
        self,
        params: Params,
        window: int = DEFAULT_WINDOW_STEPS,
        threshold: float = DEFAULT_THRESHOLD,
        sample: int = DEFAULT_SAMPLE,
        seed: int = 0,
    ) -> None:
        if window < 2:
            raise InvalidRequest(f"the movement window must be >= 2 steps, got {window}")
        if not 0 < threshold < 1:
            raise InvalidRequest(f"the movement threshold must be in (0, 1), got {threshold}")
        if not params or sample < 1:
            raise InvalidRequest("the movement metric needs parameters and a sample >= 1")
        self.params = params
        self.window = window
        self.threshold = threshold
        sizes = [p.size for p in params.values()]
        total = sum(sizes)
        rng = np.random.default_rng([seed, total])
        chosen = np.sort(rng.choice(total, size=min(total, sample), replace=False))
        # Per tensor, the flat indices of its sampled scalars.
        offsets = np.cumsum([0, *sizes])
        self._where: list[tuple[str, Array]] = []
        for (name, _), lo, hi in zip(params.items(), offsets[:-1], offsets[1:], strict=True):
            mine = chosen[(chosen >= lo) & (chosen < hi)] - lo
            if mine.size:
                self._where.append((name, mine.astype(np.int64)))
        self._prev = self._values()
        self._start = self._prev.copy()
        self._path = np.zeros_like(self._prev)  # Σ |Δ| over the window, per scalar
        self.steps = 0  # steps seen
        self.last: float | None = None  # movement of the last completed window
        self.history: list[float] = []  # every completed window's movement

    @property
    def sampled(self) -> int:
        return int(self._prev.size)

    @property
    def nbytes(self) -> int:
        """What the metric holds: three float64 values and one index per sampled scalar."""
        index = sum(idx.nbytes for _, idx in self._where)
        return self._prev.nbytes + self._start.nbytes + self._path.nbytes + index

    def _values(self) -> Array:
        return np.concatenate(
            [self.params[name].ravel()[idx].astype(np.float64) for name, idx in self._where]
        )

    def update(self) -> float | None:
        """After an optimizer step: the window's movement if this step completed a
        window, else None."""
        now = self._values()
        self._path += np.abs(now - self._prev)
        self._prev = now
        self.steps += 1
        if self.steps % self.window:
            return None
        moved = np.abs(now - self._start)
        ratio = np.divide(moved, self._path, out=np.zeros_like(moved), where=self._path > 0)
        self.last = float(ratio.mean())
        self.history.append(self.last)
        self._start = now.copy()
        self._path[...] = 0.0
        return self.last

    def converged(self, movement: float | None) -> bool:
        """Whether a window's movement says the block has converged."""
        return movement is not None and movement < self.threshold
