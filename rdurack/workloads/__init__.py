"""What runs on the rack, priced by the hardware model, pure: node programs (program.py),
Composition of Experts (coe/), the tiny functional LM (tiny_lm/), data-parallel training
(training/), a batch of requests served end to end (serving/), the fast predictor
(predictor.py) and the paper study (paper.py)."""
