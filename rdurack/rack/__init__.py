"""The pure hardware model: spec, presets, memory, residency, kernels, timing, links."""
