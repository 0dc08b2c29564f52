"""Unit tests of the pure data-parallel training core (rdurack/workloads/training)."""
