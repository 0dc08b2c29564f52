"""Datasets for functional training: scikit-learn's digits and synthetic Gaussian blobs;
the array types training works on.

Arrays stay in the model's dtype: numpy 2 promotes a float32 array multiplied by a numpy
float64 *scalar* to float64 (Python floats are "weak" and keep float32), so scalars
enter arithmetic as Python floats, and arrays are cast on the way in.

A `Dataset` is (x, y): x float32 (samples, features), y int64 class labels. Both
loaders return a `Split` (train, test) that depends only on the seed, so every rank of
a job, and every run with the same seed, sees the same split.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple, Protocol

import numpy as np
from numpy.typing import NDArray

from rdurack.errors import InvalidRequest

Array = NDArray[Any]
# Parameters, gradients and optimizer buffers: name -> array, in definition order
# (the order torch's Module.parameters() yields; DDP buckets go in reverse of it).
Params = dict[str, Array]

TRAIN_DTYPE = np.float32  # what the models train in; float64 is for gradient checks


def copy_params(params: Params) -> Params:
    """A deep copy, so a snapshot does not change when training updates in place."""
    return {name: value.copy() for name, value in params.items()}


class Dataset(NamedTuple):
    """Inputs and labels, row-aligned."""

    x: Array  # (samples, features), float32
    y: Array  # (samples,), int64 class indices

    @property
    def features(self) -> int:
        return int(self.x.shape[1])

    @property
    def classes(self) -> int:
        """Classes present (labels are 0..classes-1)."""
        return int(self.y.max()) + 1 if len(self.y) else 0

    def subset(self, indices: Array) -> Dataset:
        return Dataset(self.x[indices], self.y[indices])


class Split(NamedTuple):
    train: Dataset
    test: Dataset


def split(data: Dataset, test_fraction: float, seed: int) -> Split:
    """A shuffled train/test split; `test_fraction` of the rows (at least one) are test."""
    n = len(data.y)
    if not 0 < test_fraction < 1:
        raise InvalidRequest(f"test_fraction must be in (0, 1), got {test_fraction}")
    n_test = max(1, round(n * test_fraction))
    if n_test >= n:
        raise InvalidRequest(f"{n} samples leave no training set at test_fraction {test_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    return Split(data.subset(order[n_test:]), data.subset(order[:n_test]))


def digits(seed: int = 0, test_fraction: float = 0.25) -> Split:
    """scikit-learn's 1797 8×8 handwritten digits (64 features, 10 classes), pixels
    scaled from 0..16 to [0, 1], split by `seed`."""
    # Imported here: scikit-learn takes about a second to import, and only this needs it.
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    raw = load_digits()
    x = (np.asarray(raw.data, dtype=np.float64) / 16.0).astype(TRAIN_DTYPE)
    y = np.asarray(raw.target, dtype=np.int64)
    return split(Dataset(x, y), test_fraction, seed)


def synthetic(
    n: int, features: int, classes: int, seed: int = 0, test_fraction: float = 0.25
) -> Split:
    """`n` samples of `classes` Gaussian blobs in `features` dimensions: unit-variance
    noise around class centres drawn N(0, 2²) per coordinate, so classes overlap a
    little but are learnable. Labels are balanced (round robin), rows shuffled."""
    if n < 2 or features < 1 or classes < 2:
        raise InvalidRequest(
            f"synthetic data needs n >= 2, features >= 1, classes >= 2; got {n}, {features}, "
            f"{classes}"
        )
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, size=(classes, features))
    y = rng.permutation(np.arange(n, dtype=np.int64) % classes)
    x = (centres[y] + rng.normal(0.0, 1.0, size=(n, features))).astype(TRAIN_DTYPE)
    return split(Dataset(x, y), test_fraction, seed)


DIGITS_CLASSES = 10
DIGITS_FEATURES = 64  # 8×8 pixels


class DataSpec(Protocol):
    """Which dataset a job trains on (a rank.TrainSpec is one)."""

    @property
    def dataset(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def synthetic_samples(self) -> int: ...

    @property
    def synthetic_features(self) -> int: ...

    @property
    def synthetic_classes(self) -> int: ...


def import_loader(dataset: str) -> None:
    """Import what loading `dataset` takes (scikit-learn for digits: about a second of
    CPU), so that a rank can do it before it meets its peers."""
    if dataset == "digits":
        importlib.import_module("sklearn.datasets")


def load_data(spec: DataSpec) -> tuple[Split, int]:
    """The spec's train/test split and its number of classes."""
    if spec.dataset == "digits":
        return digits(seed=spec.seed), DIGITS_CLASSES
    data = synthetic(
        spec.synthetic_samples, spec.synthetic_features, spec.synthetic_classes, seed=spec.seed
    )
    return data, spec.synthetic_classes


def data_shape(spec: DataSpec) -> tuple[int, int]:
    """(features, classes) of the spec's dataset, without loading it."""
    if spec.dataset == "digits":
        return DIGITS_FEATURES, DIGITS_CLASSES
    return spec.synthetic_features, spec.synthetic_classes
