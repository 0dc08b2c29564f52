"""A torchrun-style DDP script, as written for GPUs, changed in two places to run on
the emulated rack: the backend ("nccl" -> "rdu") and the device ("cuda" -> "cpu").

    rdu submit train --script docs/examples/ddp_script.py --world-size 16 \
        --script-args "--epochs 6 --lr 0.05" --wait

Every rank trains on its shard of a fixed regression dataset (DistributedSampler), a
step a full pass over it; rank 0 saves a checkpoint half way by a relative path, every
rank loads it from the folder they share, and rank 0 saves the final parameters in
final.pt.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SAMPLES, FEATURES = 256, 8


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = x @ torch.randn(FEATURES, 1, generator=g) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group(backend="rdu")  # on GPUs: "nccl"
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu")  # on GPUs: torch.device("cuda", local_rank)

    net = DDP(model().to(device))  # on GPUs: DDP(..., device_ids=[local_rank])
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=SAMPLES // world, sampler=sampler)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
        if epoch == args.epochs // 2:
            if rank == 0:
                torch.save(net.module.state_dict(), "checkpoint.pt")
            dist.barrier()  # the file is there before anyone reads it
            net.module.load_state_dict(torch.load("checkpoint.pt", map_location=device))
        if rank == 0:
            print(f"epoch {epoch} local rank {local_rank} loss {loss.item():.6f}")
    if rank == 0:
        torch.save(net.module.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
