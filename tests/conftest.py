"""Shared test set-up. Importing rdurack first sets Ray's loopback environment."""

import rdurack  # noqa: F401  (sets RAY_* defaults before any test imports ray)
