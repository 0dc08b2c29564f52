"""Benchmark of a platform of two racks on one machine (what `rdu up --racks 2` runs):
4 node agents x 8 socket actors, 32 sockets.

Two figures, each beside a floor from the same run:
- its bring-up, over the bring-up of Ray with 32 bare actors and 4 bare gRPC servers
  (bench_rack_floors.bring_up_s), at most 2x, as the one-rack figure holds;
- its memory idle (PSS of this process and all it started), over a one-rack platform's
  measured right after it: two racks hold twice the socket actors and share Ray's own
  processes, so at most 2.1x (a socket of a two-rack platform costs at most 5% more
  than one of a single rack). Its absolute figure is reported too, against the 6 GB
  that two racks of the one-rack target (3 GB) make.
"""

from __future__ import annotations

import time

import ray

from rdurack.devtools import bench_rack_floors as floors
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.bench_rack import rack_pss_bytes
from rdurack.node_agent.actors import start_ray
from rdurack.node_agent.in_process import start_rack
from rdurack.rack.presets import platform, with_racks
from rdurack.rack.spec import PlatformSpec

RACKS = 2


def _up(p: PlatformSpec) -> tuple[float, int]:
    """Wall seconds to bring `p` up on a fresh Ray, and its memory idle (PSS, bytes);
    stopped after."""
    started = time.monotonic()
    start_ray()
    agents = start_rack(p)
    took = time.monotonic() - started
    try:
        return took, rack_pss_bytes()
    finally:
        for a in agents:
            a.stop()
        ray.shutdown()


def bench_racks() -> list[BenchFigure]:
    one = platform("sn40l-rack16")
    two = with_racks(one, RACKS)
    shape = (two.sockets, two.nodes_total)
    floor_before = floors.bring_up_s(*shape)
    bring_up, pss = _up(two)
    floor_after = floors.bring_up_s(*shape)
    _, one_pss = _up(one)
    return [
        BenchFigure(
            f"wall time to bring up {two.sockets} ready sockets ({RACKS} racks)",
            bring_up,
            "s",
            2.0,
            "lower",
            floor=(floor_before + floor_after) / 2,
        ),
        BenchFigure(
            f"memory of {RACKS} racks idle over one rack's (PSS)",
            pss / 1e9,
            "GB",
            2.1,
            "lower",
            floor=one_pss / 1e9,
        ),
        BenchFigure(f"memory of {RACKS} racks idle (PSS)", pss / 1e9, "GB", 6.0, "lower"),
    ]
