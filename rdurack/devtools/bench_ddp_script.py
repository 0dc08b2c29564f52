"""The torchrun-style script `make bench` times (devtools/bench_torch.py), on whichever
backend its argument names: DDP steps of an MLP, then bare all-reduces of its
gradients' size, each after a barrier so that all ranks start it together. Rank 0
prints the medians (wall seconds, warm-up steps left out) as one line of JSON."""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 (torch users write it so)

WARM_UP = 2  # steps left out of the medians


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rdu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    w = args.width
    net = DDP(torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w)))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(32, w)
    steps, all_reduces = [], []
    for _ in range(args.steps):
        dist.barrier()
        began = time.perf_counter()
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
        steps.append(time.perf_counter() - began)
    grads = torch.zeros(sum(p.numel() for p in net.parameters()))
    for _ in range(args.steps):
        dist.barrier()
        began = time.perf_counter()
        dist.all_reduce(grads)
        all_reduces.append(time.perf_counter() - began)
    if dist.get_rank() == 0:
        # Flushed now: if another rank dies in the teardown below, torchrun ends this one
        # with SIGTERM, and what a pipe's buffer held is lost (once, a gloo rank's
        # SIGABRT cost a whole run of `make bench` its torch figures that way).
        print(json.dumps({
            "step_s": statistics.median(steps[WARM_UP:]),
            "all_reduce_s": statistics.median(all_reduces[WARM_UP:]),
            "bytes": grads.nbytes,
        }), flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
