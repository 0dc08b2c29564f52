"""The rack's control plane: jobs, their states, the job store and the scheduler (next issue)."""
