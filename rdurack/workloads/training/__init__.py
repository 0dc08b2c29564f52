"""Data-parallel training in the shape of PyTorch DDP, with no cluster.

The pure core of the built-in DDP jobs: small torch models trained with autograd,
`torch.optim`, torch's `DistributedSampler` and torch's `DistributedDataParallel`, over a
process group (group.py) on a small `Backend` protocol (an in-process `ThreadGroup`
here; the gRPC links between socket actors on the cluster); what a step costs and how
DDP scales (scaling.py), rank-0 checkpoints, progressive training (ProFL), and the
reference training loop. It also diagnoses the article's DDP mistakes: replicas that
start from different parameters, stragglers that outlast the timeout, every rank
writing checkpoints, loading without a map_location to the rank's own device, and a
data loader without a distributed sampler. (A user's own script runs on torch's DDP over
the "rdu" backend: node_agent/training.)
"""
