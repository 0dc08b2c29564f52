"""What the plot of a DDP scaling study shows (`rdu predict ddp`, the docs' figure of
`--racks 64`): step time and scaling efficiency against the sockets (ranks). A curve
goes to and from a dict so that the PNG carries the figures it draws and the docs' test
can compare them with the table beside it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ScalingCurve:
    """One study: per world size (ranks, one per socket), step time (emulated s) and
    efficiency (one rank's step over this step)."""

    model: str
    platform: str
    racks: int
    ranks: tuple[int, ...]
    step_s: tuple[float, ...]
    efficiency: tuple[float, ...]
    source: str = ""  # the command that computed it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalingCurve:
        """The curve of `as_dict` (read back from JSON: lists for tuples)."""
        return cls(
            model=str(data["model"]),
            platform=str(data["platform"]),
            racks=int(data["racks"]),
            ranks=tuple(int(n) for n in data["ranks"]),
            step_s=tuple(float(t) for t in data["step_s"]),
            efficiency=tuple(float(e) for e in data["efficiency"]),
            source=str(data.get("source", "")),
        )


def scaling_curve(data: dict[str, Any], source: str = "") -> ScalingCurve:
    """The curve of `rdu predict ddp --json`'s output."""
    rows = data["scaling"]
    if not rows:
        raise ValueError("a scaling study with no world size")
    return ScalingCurve(
        model=str(data["model"]),
        platform=str(data["platform"]),
        racks=int(data.get("racks", 1)),
        ranks=tuple(int(r["world_size"]) for r in rows),
        step_s=tuple(float(r["step_s"]) for r in rows),
        efficiency=tuple(float(r["efficiency"]) for r in rows),
        source=source,
    )


def scaling_title(c: ScalingCurve) -> str:
    racks = f"{c.racks} racks of " if c.racks > 1 else ""
    return f"DDP of {c.model} on {racks}{c.platform}: step time and efficiency against ranks"
