"""What `rdu calibrate --write` records in rack/calibration.json: the objective, the fitted
values (the presets read only these), the cost, each fitted figure's prediction in
sample and left out of the fit, and how the fit was searched.

The record is stale when the model's code changed after it was written: the in-sample
predictions it holds then differ from what the code predicts now (`stale` says which),
and a test fails until `rdu calibrate --write` runs again.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from rdurack.config import Config
from rdurack.errors import InvalidRequest
from rdurack.rack.calibration import CALIBRATION_FILE
from rdurack.workloads.paper.figure import Figure

Prediction = float | tuple[float, float]
OBJECTIVE = (
    "least squares of log(predicted / published) over the fitted figures; a range figure "
    "counts by how far (in the same log measure) its predicted span leaves the range"
)


class Calibration(Config):
    objective: str = OBJECTIVE
    seed: int
    random_starts: int
    cost: float
    values: dict[str, float]
    in_sample: dict[str, Prediction]
    leave_one_out: dict[str, Prediction]


def read(path: Path = CALIBRATION_FILE) -> Calibration:
    try:
        return Calibration.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError) as e:
        first = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        raise InvalidRequest(f"{path}: {first}; run rdu calibrate --write") from None


def write(record: Calibration, path: Path = CALIBRATION_FILE) -> Path:
    """The record as indented JSON, written whole (a temporary file, then a rename), so
    a crash never leaves half a calibration behind."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record.model_dump(), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def stale(record: Calibration, figures: list[Figure], rel: float = 1e-9) -> list[str]:
    """The fitted figures whose prediction now differs from the record's in-sample one."""
    now = {f.key: f.predicted for f in figures if f.fitted}
    out = [key for key in now.keys() ^ record.in_sample.keys()]
    for key in now.keys() & record.in_sample.keys():
        a, b = _pair(now[key]), _pair(record.in_sample[key])
        if not all(math.isclose(x, y, rel_tol=rel) for x, y in zip(a, b, strict=True)):
            out.append(key)
    return sorted(out)


def _pair(p: Prediction | bool) -> tuple[float, ...]:
    assert not isinstance(p, bool), "yes/no figures are not fitted"
    return p if isinstance(p, tuple) else (p,)


def with_left_out(figures: list[Figure], record: Calibration) -> list[Figure]:
    """The figures, each fitted one with its leave-one-out prediction from the record."""
    return [
        replace(f, left_out=record.leave_one_out[f.key]) if f.key in record.leave_one_out else f
        for f in figures
    ]
