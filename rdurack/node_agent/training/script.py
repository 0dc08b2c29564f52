"""A torchrun-style script as one rank of a job, in its socket's actor process: run as
`__main__` with the environment torchrun gives a rank, over the "rdu" process group
(process_group.py).

What the rank gets, as from torchrun:
- `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (its place among the job's sockets on its node),
  `LOCAL_WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT`; `sys.argv` = [file name, *args];
- rendezvous as torchrun's agent does it: rank 0's process hosts a TCPStore on a free
  port for the job's life and `TORCHELASTIC_USE_AGENT_STORE=True` makes every rank's
  `init_process_group` connect to it; its address travels over the links, on a scratch
  engine (bookkeeping the hardware does not do: no emulated time);
- the job's working folder as its current directory, shared by all ranks (a checkpoint
  rank 0 saves by a relative path is there for the others), and its stdout and stderr
  in its log (workloads/training/job.py).

Process-wide state (cwd, environment, argv, `__main__`, stdout) is the rank's for the
call: a socket actor runs one call at a time. It is restored afterwards, and a process
group the script left open is destroyed, so the next job in this process starts clean.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import socket
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch.distributed as dist
from ray import cloudpickle
from torch._C._distributed_c10d import TCPStore

from rdurack.errors import RdurackError
from rdurack.node_agent.training.host import RankHost
from rdurack.node_agent.training.process_group import RankLinks, register
from rdurack.node_agent.training.script_checks import Checks
from rdurack.node_agent.training.script_kernels import kernels_for
from rdurack.node_agent.training.script_memory import TensorMemory
from rdurack.node_agent.training.script_time import Pricing, Streams
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.timing import Timer
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.job import TrainingWorkload, log_path, work_dir

ADDRESS_BYTES = 256  # room for "host:port" in the rendezvous broadcast
TRACEBACK_LINES = 12  # of a failed rank's traceback, in the job's error (all: its log)


class ScriptFailed(RdurackError):
    """A rank's script raised or exited with a non-zero code."""

    def __init__(self, rank: int, device: str, detail: str) -> None:
        self.args_ = (rank, device, detail)
        super().__init__(f"rank {rank} ({device}) failed: {detail}")

    def __reduce__(self) -> tuple[type, tuple[int, str, str]]:
        return (type(self), self.args_)


class Rendezvous:
    """Where a job's ranks meet for `init_process_group`: rank 0 hosts the store."""

    def __init__(self, links: RankLinks, rank: int, host: str, wall_timeout_s: float) -> None:
        self.store: TCPStore | None = None
        address = np.zeros(ADDRESS_BYTES, dtype=np.uint8)
        if rank == 0:
            # Listening on the links' host only (TCPStore alone listens on every
            # interface): a socket of our own, handed over by its descriptor (the store
            # closes it).
            listener = socket.create_server((host, 0))
            port = listener.getsockname()[1]
            self.store = TCPStore(
                host, port, len(links.sockets), is_master=True,
                timeout=timedelta(seconds=wall_timeout_s), wait_for_workers=False,
                master_listen_fd=listener.detach(),
            )  # fmt: skip
            raw = f"{host}:{port}".encode()
            address[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        if len(links.sockets) > 1:
            members = [SocketId.parse(s) for s in links.sockets]
            engine = links.engine.scratch()
            plan = engine.plan("broadcast", members, address, root=links.sockets[0])
            tag = f"{links.job_id}/script/rendezvous"
            engine.run(
                tag, plan, EmulatedClock(links.streams.clock.now_ns), wall_timeout_s, address
            )
        self.host, port = bytes(address).rstrip(b"\0").decode().rsplit(":", 1)
        self.port = int(port)
        # This rank's connection to the store: for init_process_group's agent store, and
        # for the ranks' bookkeeping (script_checks.py).
        self.client: TCPStore | None = self.store or TCPStore(
            self.host, self.port, is_master=False, timeout=timedelta(seconds=wall_timeout_s)
        )

    def close(self) -> None:
        # The server stops (and closes its socket) with its last reference.
        self.store = self.client = None


def node_ranks(sockets: Sequence[str], rank: int) -> list[str]:
    """The sockets of rank `rank`'s node among `sockets`, in rank order (its index there
    is torchrun's LOCAL_RANK)."""
    node = SocketId.parse(sockets[rank]).node
    return [s for s in sockets if SocketId.parse(s).node == node]


def rank_environment(sockets: Sequence[str], rank: int, rendezvous: Rendezvous) -> dict[str, str]:
    """What torchrun sets for rank `rank` of a job on `sockets` (by rank)."""
    me = SocketId.parse(sockets[rank])
    local = node_ranks(sockets, rank)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(len(sockets)),
        "LOCAL_RANK": str(local.index(sockets[rank])),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(me.node),
        "MASTER_ADDR": rendezvous.host,
        "MASTER_PORT": str(rendezvous.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


@dataclass
class RankRun:
    """What a rank runs and where: the rank's links and rendezvous, the job's directory
    (its shared folder and logs), the memory its tensors are held on."""

    links: RankLinks
    rank: int
    job_dir: Path
    rendezvous: Rendezvous
    memory: TensorMemory | None = None

    def script(self, source: bytes, name: str, args: Sequence[str]) -> None:
        """Run the script `source` (file name `name`, argv `args`) as `__main__`."""
        path = str(work_dir(self.job_dir) / name)  # what tracebacks and __file__ show
        text = source.decode()
        # Tracebacks show the script's lines, though the file is not on this host's disk.
        linecache.cache[path] = (len(text), None, text.splitlines(keepends=True), path)
        try:
            code = compile(text, path, "exec")
            main = types.ModuleType("__main__")
            main.__file__ = path
            self._run(lambda: exec(code, main.__dict__), name, [name, *args], main)
        finally:
            linecache.cache.pop(path, None)

    def function(self, fn: Callable[[TrainContext], Any]) -> Any:
        """Run a client's function `fn(ctx)` (run_training_loop's); its return value."""
        links, rank = self.links, self.rank
        local = node_ranks(links.sockets, rank).index(links.sockets[rank])
        ctx = TrainContext(
            rank, len(links.sockets), local, links.sockets[rank], work_dir(self.job_dir)
        )
        name = getattr(fn, "__name__", "loop")
        returned: list[Any] = []
        self._run(lambda: returned.append(fn(ctx)), name, [name], sys.modules["__main__"])
        return returned[0] if returned else None

    def _run(
        self, body: Callable[[], object], name: str, argv: list[str], main: types.ModuleType
    ) -> None:
        """`body` as the rank, in its environment; its output in its log. Raises
        ScriptFailed if it fails."""
        links, rank = self.links, self.rank
        cwd = work_dir(self.job_dir)
        cwd.mkdir(parents=True, exist_ok=True)
        log = log_path(self.job_dir, rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        register(links)
        env = rank_environment(links.sockets, rank, self.rendezvous)
        me = links.sockets[rank]
        with log.open("a", buffering=1) as out, _process_state(cwd, env, argv, main, out):
            try:
                with Pricing(links.streams, self.memory), _watching(links.checks):
                    body()
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise ScriptFailed(rank, me, f"{name} exited with code {e.code}") from None
            except BaseException as e:  # the rank's own errors: the job's error names them
                stopped = links.streams.stop_reason  # the job stopped it (script_thread.py):
                if stopped is not None:  # at an operator, or in a collective it ended
                    print(f"rdurack: {name} stopped: {stopped}", file=out)
                    raise ScriptFailed(rank, me, f"stopped: {stopped}") from None
                traceback.print_exc(file=out)
                tail = traceback.format_exception(e)[-TRACEBACK_LINES:]
                raise ScriptFailed(rank, me, "".join(tail).strip()) from None
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()


@dataclass
class TrainContext:
    """What a client's function gets on its rank (Ray Train's `train_loop_per_worker`
    receives its config the same way); torch.distributed is torch's own, the "rdu"
    backend registered, and the environment a script gets is set too."""

    rank: int
    world_size: int
    local_rank: int
    device: str  # the rank's socket
    work_dir: Path  # the ranks' shared folder, the current directory
    config: dict[str, Any] = field(default_factory=dict)


def _watching(checks: Checks | None) -> contextlib.AbstractContextManager[None]:
    return checks.watching() if checks is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _process_state(
    cwd: Path,
    env: Mapping[str, str],
    argv: list[str],
    main: types.ModuleType,
    out: TextIO,
) -> Iterator[None]:
    """The process as the rank's script sees it, restored afterwards."""
    saved_cwd, saved_argv, saved_main = os.getcwd(), sys.argv, sys.modules["__main__"]
    saved_env = {k: os.environ.get(k) for k in env}
    saved_out, saved_err = sys.stdout, sys.stderr
    os.chdir(cwd)
    os.environ.update(env)
    sys.argv, sys.modules["__main__"] = argv, main
    sys.stdout = sys.stderr = out
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved_out, saved_err
        sys.argv, sys.modules["__main__"] = saved_argv, saved_main
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(saved_cwd)


class ScriptRank:
    """Rank `rank` of a script job (or a client's function) on `host` (a socket): the
    rendezvous when it starts, then the script, once."""

    def __init__(
        self,
        host: RankHost,
        job_id: str,
        group: Sequence[str],
        rank: int,
        w: TrainingWorkload,
        platform: PlatformSpec,
    ) -> None:
        """`platform`: whose socket prices the script's operators (the job's)."""
        timer = Timer(platform, [SocketId.parse(host.name)])
        kernels = kernels_for(timer, w.plan(platform))
        streams = Streams(host.clock, kernels, lambda: host.slowdown)
        checks = Checks(job_id, list(group), rank, w.wall_timeout_s, w.timeout_s)
        self.links = RankLinks(host.engine, streams, job_id, list(group), w.wall_timeout_s, checks)
        self.rank = rank
        self.w = w
        listen = host.address().rsplit(":", 1)[0].strip("[]")  # the links' host
        self.rendezvous = Rendezvous(self.links, rank, listen, w.wall_timeout_s)
        checks.store = self.rendezvous.client
        checks.stopped = lambda: streams.stop_reason
        self.returned = b""  # a client's function's return value, pickled

    def run(self, job_dir: Path, memory: TensorMemory) -> Streams:
        """Run the job's script, or its client's function, its tensors held on
        `memory`; what its operators and collectives took. A function's return value
        is `returned`, pickled."""
        w = self.w
        run = RankRun(self.links, self.rank, job_dir, self.rendezvous, memory)
        if w.script:
            run.script(w.script, w.script_name, w.script_args)
        else:
            fn = cloudpickle.loads(w.loop)
            self.returned = bytes(cloudpickle.dumps(run.function(fn)))  # type: ignore[no-untyped-call]
        return self.links.streams

    def close(self) -> None:
        self.rendezvous.close()
