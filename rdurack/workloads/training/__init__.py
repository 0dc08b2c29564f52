"""Data-parallel training in the shape of PyTorch DDP, with no cluster.

The pure core of the built-in DDP jobs: torch.distributed-style process groups over a
small `Backend` protocol (an in-process `ThreadGroup` here; gRPC links between socket
actors once wired onto the cluster), small torch models trained with autograd,
`torch.optim` and torch's `DistributedSampler`, a `DistributedDataParallel` with torch's
gradient buckets over that `Backend`, the overlap timing of bucket all-reduces with
backward, rank-0 checkpoints, and a reference training loop. It also diagnoses the
article's DDP mistakes: replicas that start from different parameters, a wrong world
size or rank, stragglers that outlast the timeout, every rank writing checkpoints,
loading without a map_location to the rank's own device, and a data loader without a
distributed sampler. (A user's own script runs on torch's DDP instead: node_agent/training.)
"""
