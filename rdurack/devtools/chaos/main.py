"""`make chaos`: random faults under a steady mixed workload, bounded in time, then an
audit of the job store: no job lost, none left hanging.

    python -m rdurack.devtools.chaos [--duration-s 170] [--seed S] [--nodes 2]
        [--sockets-per-node 4] [--state-dir build/chaos] [--json]

1. It brings a local rack up as `rdu up` does (or a ChaosRun is given one: run.py).
2. A submitter sends a job every `submit_every_s`: kernel, CoE and small training jobs
   in turn, each with a client request id (a submission that fails in transit is sent
   again, never twice).
3. A seeded plan (printed) injects faults through AdminService at random instants, of
   random kinds and targets, each healed after a random while: kill a socket (noticed
   by the health watcher: the run prints in how long), kill a node agent (restarted as
   its supervisor would, `local_rack.restart_agent`), slow a socket, drop or delay a
   link, partition the nodes. A fault that cannot be injected then (its target is
   already down) is reported as skipped.
4. After the fault window everything is healed and every job must reach a terminal
   state before the deadline.
5. It reads the job store itself and prints jobs submitted, succeeded, retried,
   re-routed (CoE), failed with their reasons, and `lost: N, hanging: M`: lost, an
   acknowledged submission missing from the store; hanging, a job not finished at the
   deadline. The exit code is 1 if either is not 0.

`run` brings the rack up in STATE_DIR and down again around a ChaosRun (run.py); `main`
reads the flags, takes down a rack a killed run left there, and prints the report
(report.py), or with `--json` one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rdurack.devtools.chaos.plan import ChaosConfig
from rdurack.devtools.chaos.report import ChaosReport
from rdurack.devtools.chaos.run import ChaosRun, Rack
from rdurack.errors import RdurackError
from rdurack.processes import local_rack, rack_record

STOP_RESERVE_S = 20.0  # kept at the end to stop the rack's processes
STOP_WAIT_S = 8.0  # per process, after SIGTERM, before SIGKILL


def run(config: ChaosConfig, state_dir: Path, say: Callable[[str], None] = print) -> ChaosReport:
    """Bring a local rack up in `state_dir`, run the chaos, take the rack down."""
    began = time.monotonic()
    deadline = began + config.duration_s  # the whole run, bring-up and stop included
    say(f"rdu up: {config.nodes} nodes x {config.sockets_per_node} sockets in {state_dir}")
    for old in state_dir.glob("jobs.sqlite*"):  # the audit counts this run's jobs only
        old.unlink()
    procs = local_rack.up(
        state_dir,
        config.nodes,
        config.sockets_per_node,
        port=0,
        timeout_s=config.duration_s,
        time_scale=config.time_scale,
    )
    say(f"rack up in {time.monotonic() - began:.0f} s")
    try:
        rack = Rack(procs.orchestrator, "", state_dir)  # the open local default
        chaos = ChaosRun(rack, config, say)
        try:
            report = chaos.run(deadline - STOP_RESERVE_S)
        finally:
            chaos.close()
    finally:
        for line in local_rack.down(state_dir, wait_s=STOP_WAIT_S):
            say(f"  {line}")
    report.wall_s = time.monotonic() - began  # bring-up and stop included
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rdurack.devtools.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration-s", type=float, default=170.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--sockets-per-node", type=int, default=4)
    p.add_argument("--faults", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--state-dir", type=Path, default=Path("build/chaos"))
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        fields: dict[str, Any] = {
            "duration_s": args.duration_s,
            "nodes": args.nodes,
            "sockets_per_node": args.sockets_per_node,
            "faults": args.faults,
            "time_scale": args.time_scale,
        }
        if args.seed is not None:
            fields["seed"] = args.seed
        config = ChaosConfig.model_validate(fields)
    except ValueError as e:
        print(f"chaos: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if (args.state_dir / rack_record.RACK_FILE).exists():
        with contextlib.suppress(RdurackError):
            for line in local_rack.down(args.state_dir):  # a rack a killed run left
                print(f"  {line}")
    try:
        report = run(config, args.state_dir, say=(lambda _: None) if args.json else print)
    except RdurackError as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
