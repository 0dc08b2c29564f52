"""Job kinds: one module per workload kind (kernel.py, coe.py, training.py), each
refusing up front what could never run, running a placed job on the node agents and
building its result; contract.py is what a kind is to the orchestrator, what it knows of
the rack and what it is handed to run a job; platforms.py is the platform a job
emulates.

The orchestrator keeps its kinds in a registry keyed by the JobSpec workload's `kind`,
built in its constructor."""
