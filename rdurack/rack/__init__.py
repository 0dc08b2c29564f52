"""The hardware model, pure (no gRPC, Ray or generated code): platform specs and presets
with their sources, what-if overrides, model shapes, tiered memory and residency, kernels
and their timing, topology, links and collective schedules, emulated clocks, and the
faults a rack can suffer."""
