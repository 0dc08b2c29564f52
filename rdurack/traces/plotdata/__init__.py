"""What the plots of a job, of the paper study and of a serving study show, derived from
spans and results without drawing anything: no matplotlib here (traces/plots/ draws it).

- units.py: the time and byte units an axis is labelled in.
- timeline.py: the timeline's rows (sockets), operation kinds, colours and bars.
- memory.py: memory per tier over emulated time, and the tiers' capacities.
- training.py: loss points and stage points, from spans or from a job result.
- paper.py: the paper figures sorted into value, range and yes/no rows, with their
  labels and texts.
- serving.py: a serving study's curves (TTFT p50 and p99, ITL p99 against the rate) and
  their latency ticks.
"""
