"""Array aliases shared by the training modules, and the float32 discipline.

numpy 2 promotes a float32 array multiplied by a numpy float64 *scalar* to float64
(Python floats are "weak" and keep float32). Training keeps every array in the model's
dtype: scalars enter arithmetic as Python floats, and arrays are cast on the way in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

Array = NDArray[Any]
# Parameters, gradients and optimizer buffers: name -> array, in definition order
# (the order torch's Module.parameters() yields; DDP buckets go in reverse of it).
Params = dict[str, Array]

TRAIN_DTYPE = np.float32  # what the models train in; float64 is for gradient checks


def as_dtype(x: Any, dtype: DTypeLike) -> Array:
    """`x` as an array of `dtype`, without copying when it already is one."""
    return np.asarray(x, dtype=dtype)


def copy_params(params: Params) -> Params:
    """A deep copy, so a snapshot does not change when training updates in place."""
    return {name: value.copy() for name, value in params.items()}
