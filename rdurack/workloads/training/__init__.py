"""Data-parallel training in the shape of PyTorch DDP, on numpy, with no cluster.

The pure core of functional DDP: torch.distributed-style process groups over a small
`Backend` protocol (an in-process `ThreadGroup` here; gRPC links between socket actors
once wired onto the cluster), numpy models with manual backward, optimizers with torch's
update rules, `DistributedSampler`, `DistributedDataParallel` with torch's gradient
buckets, the overlap timing of bucket all-reduces with backward, rank-0 checkpoints, and
a reference training loop. It also diagnoses the article's DDP mistakes: replicas that
start from different parameters, a wrong world size or rank, stragglers that outlast
the timeout, every rank writing checkpoints, loading without a map_location to the
rank's own device, and a data loader without a distributed sampler.
"""
