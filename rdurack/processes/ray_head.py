"""A local Ray cluster as a process: `python -m rdurack.processes.ray_head`.

`rdu up` starts it first; node agents then join it with `--ray-address`. It starts Ray
on loopback (importing rdurack set Ray's environment), prints one line
`ray-head ready at <gcs address>`, and on SIGTERM or SIGINT shuts Ray down and exits 0.
Its one setting (flag, else variable; any other flag is refused in one line on stderr,
exit code 2):

    --host   RDURACK_HOST   the Ray node's address (default 127.0.0.1, loopback). Any
                            other makes the head one that other hosts can join (`ray
                            start --address`, with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1
                            there); Ray then serves on every interface of this machine.

Ray reads its own `RAY_*` variables.
"""

from __future__ import annotations

import logging
import sys

from pydantic_settings import SettingsConfigDict

import rdurack  # noqa: F401  (sets Ray's loopback environment before Ray is imported)
from rdurack.errors import RdurackError
from rdurack.processes.settings import ProcessSettings, load
from rdurack.processes.stop_signal import StopSignal

# --help prints the module docstring.
HELP = __doc__


class RayHeadSettings(ProcessSettings):
    """The Ray head's settings: the module docstring's table."""

    model_config = SettingsConfigDict(
        cli_prog_name="python -m rdurack.processes.ray_head",
        json_schema_extra={"description": HELP},
    )

    host: str = "127.0.0.1"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        args = load(RayHeadSettings, argv)
    except RdurackError as e:
        print(f"ray-head: {e}", file=sys.stderr)
        return 2
    # Before Ray starts: a SIGTERM that arrives while Ray starts still stops it cleanly.
    stop = StopSignal().install()
    import ray

    from rdurack.node_agent.actors import start_ray

    start_ray(host=args.host)
    stop.install()  # again: Ray's core worker installs its own SIGTERM handler
    print(f"ray-head ready at {ray.get_runtime_context().gcs_address}", flush=True)
    stop.wait()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
