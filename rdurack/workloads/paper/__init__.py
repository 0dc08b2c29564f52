"""The published figures rdurack reproduces: each figure (figure.py) and the study that
predicts all of them from one parameter set (study.py; PAPER Table V in table_v.py,
Table IV in table_iv.py)."""
