"""The tiny functional language model: its weights and tensor-parallel shards (model.py)
and greedy generation over them, the all-reduces carried by the caller (generation.py)."""
