"""The rack's control plane, without gRPC, Ray or generated code: jobs and their states
(jobs.py) and results (results.py); the job store (store/, on SQLite or PostgreSQL);
the Orchestrator (orchestrator.py) and what it composes: the kinds of job (kinds/), the
scheduling round (scheduling.py) and its policy (scheduler.py), run supervision under
faults (supervision.py), the health watcher (health.py), watchers' wake-ups
(signals.py); fault injection (fault_injector.py); and the NodeGateway protocol through
which it reaches the node agents (gateway.py)."""
