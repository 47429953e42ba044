"""Checkpoints: the sharded save and load (`sharded.py`), the on-disk format, schema and integrity
checks, the save directory a run owns, the decision where a run starts, and the transformers export."""
