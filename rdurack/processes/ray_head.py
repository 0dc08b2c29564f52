"""A local Ray cluster as a process: `python -m rdurack.processes.ray_head`.

`rdu up` starts it first; node agents then join it with `--ray-address`. It starts Ray
on loopback (importing rdurack set Ray's environment), prints one line
`ray-head ready at <gcs address>`, and on SIGTERM or SIGINT shuts Ray down and exits 0.
"""

from __future__ import annotations

import logging
import sys

import rdurack  # noqa: F401  (sets Ray's loopback environment before Ray is imported)
from rdurack.processes.stop_signal import StopSignal


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # First: a SIGTERM that arrives while Ray starts still stops it cleanly.
    stop = StopSignal().install()
    import ray

    from rdurack.node_agent.actors import start_ray

    start_ray()
    stop.install()  # again: Ray's core worker installs its own SIGTERM handler
    print(f"ray-head ready at {ray.get_runtime_context().gcs_address}", flush=True)
    stop.wait()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
