"""The rack's data plane: a node agent (agent.py) hosting its node's socket actors
(socket.py: tiers, kernels, programs; Ray applied in actors.py), their collectives
(collective_engine.py) over socket-to-socket gRPC links (links/), a DDP rank on a socket
(training/), and a socket's emulated timeline in wall time (timeline/: pacing, hardware
spans). Beside them: a job's memory on a socket (job_memory.py), functional generation
(generation.py), the fault plan as a pure function (fault_plan.py), Ray call helpers
(ray_calls.py) and the Ray-free health report the orchestrator's side converts
(health.py)."""
