"""Serve jobs against `rdu predict serve`: how far apart two reports are, field by field."""

from __future__ import annotations

from typing import Any

AGREEMENT = 0.03  # the bound between the cluster and the predictor


def _leaves(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(cluster: dict[str, Any], predicted: dict[str, Any]) -> dict[str, float]:
    """Every field of the predicted report (nested ones as `breakdown.prefill_s`) against
    the cluster's: the relative difference of each number. A field the cluster lacks,
    or a text or null that differs, fails at once."""
    got, want = _leaves(cluster), _leaves(predicted)
    out: dict[str, float] = {}
    for key, value in want.items():
        assert key in got, f"the cluster's report has no {key}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            other = got[key]
            assert isinstance(other, int | float), f"{key}: {other!r} against {value!r}"
            out[key] = abs(other - value) / abs(value) if value else abs(other)
        else:
            assert got[key] == value, f"{key}: {got[key]!r} against {value!r}"
    return out


def assert_agree(cluster: dict[str, Any], predicted: dict[str, Any]) -> float:
    """The largest relative difference between the two; fails above AGREEMENT."""
    diffs = differences(cluster, predicted)
    worst = max(diffs, key=diffs.__getitem__)
    assert diffs[worst] <= AGREEMENT, (
        f"{worst}: cluster {_leaves(cluster)[worst]!r}, predicted {_leaves(predicted)[worst]!r}"
    )
    return diffs[worst]
