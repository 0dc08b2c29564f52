"""The floor of "rdu up to ready": the processes `rdu up` starts, in its order, with
nothing of rdurack's services in them.

`rdu up` (processes/local_rack.py) starts a Ray head process, then the node agents
(each joins Ray, starts its 8 socket actors and serves gRPC), then the orchestrator
(serves gRPC), each a `python -m` process waited for by its ready line. The floor does
the same with `python -m rdurack.devtools.bench_up_floor ROLE`:

- `head`: starts Ray as the rack's head does (`start_ray`), prints its ready line;
- `agent --ray-address A`: joins Ray, starts SOCKETS bare actors (num_cpus=0, each
  answering once, bench_bare.Bare) and a bare gRPC server;
- `server`: a bare gRPC server (the orchestrator's place).

Each prints `<role> ready at <address>` and stops on SIGTERM. `up_s` times the whole
from the first spawn to the last ready line, as bench_control times `rdu up`, with the
same spawning and waiting (processes/children.py), and stops what it started by pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import ray

from rdurack import RAY_ENVIRONMENT
from rdurack.devtools.bench_bare import BareActor
from rdurack.node_agent.actors import start_ray
from rdurack.processes import children

MODULE = "rdurack.devtools.bench_up_floor"
DEADLINE_S = 120.0


def up_s(agents: int = 2, sockets: int = 8) -> float:
    """Wall seconds from nothing to a bare head, `agents` bare agents of `sockets` actors
    and a bare server, all ready."""
    env = {**os.environ, **RAY_ENVIRONMENT, "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="rdurack-up-floor-") as tmp:
        logs = Path(tmp)
        deadline = time.monotonic() + DEADLINE_S

        def start(name: str, args: list[str]) -> dict[str, tuple[subprocess.Popen[bytes], str]]:
            procs.append(children.spawn(name, MODULE, args, logs, env))
            return {name: (procs[-1], args[0])}

        try:
            began = time.perf_counter()
            head = children.await_ready(start("head", ["head"]), logs, deadline)["head"]
            waiting: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
            for i in range(agents):
                args = ["agent", "--ray-address", head, "--sockets", str(sockets)]
                waiting |= start(f"agent-{i}", args)
            children.await_ready(waiting, logs, deadline)
            children.await_ready(start("server", ["server"]), logs, deadline)
            return time.perf_counter() - began
        finally:
            for proc in reversed(procs):  # the head last: the agents leave Ray first
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _serve() -> tuple[grpc.Server, str]:
    """A bare gRPC server, serving (kept by the caller: a dropped one stops)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("head", "agent", "server"))
    parser.add_argument("--ray-address", default="")
    parser.add_argument("--sockets", type=int, default=8)
    args = parser.parse_args(argv)
    stopped = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    server: grpc.Server | None = None
    if args.role == "server":
        server, address = _serve()
    else:
        start_ray(args.ray_address or None)
        signal.signal(signal.SIGTERM, stop)  # again: Ray's core worker installs its own
        address = ray.get_runtime_context().gcs_address
        if args.role == "agent":
            actors = [BareActor.remote() for _ in range(args.sockets)]
            ray.get([a.ready.remote() for a in actors])
            server, address = _serve()
    print(f"{args.role} ready at {address}", flush=True)
    stopped.wait()
    if server is not None:
        server.stop(0)
    if args.role != "server":
        ray.shutdown()  # the head's: stops the Ray processes it started


if __name__ == "__main__":
    main()
