"""Pure workloads on the hardware model: the fast predictor and the paper study."""
