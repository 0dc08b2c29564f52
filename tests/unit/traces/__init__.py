"""Unit tests of trace files read back (rdurack/traces/): reading and selecting a job's
spans, the Jaeger and Chrome exports, `rdu trace`, the plot data and the plots."""
