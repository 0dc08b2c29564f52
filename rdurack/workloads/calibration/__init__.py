"""The joint calibration of the unpublished assumptions: the fit, leave-one-out and the
sensitivity of each figure to each assumption (fit.py), and the record it writes to
rack/calibration.json (record.py)."""
