"""Where the model meets the method: the SEAL loop (train.py, top to bottom), the supervised warm start,
and live logging of a run."""
