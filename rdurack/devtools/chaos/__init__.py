"""`make chaos`: random faults under a steady mixed workload on a local rack, bounded in
time, then an audit of the job store (main.py says how a run goes). `plan` draws the
faults and the jobs from a seed, `run` injects and heals them while a submitter sends
the jobs, `report` reads the job store and says what was lost or left hanging, `main`
brings the rack up and down around it (`python -m rdurack.devtools.chaos`).
"""
