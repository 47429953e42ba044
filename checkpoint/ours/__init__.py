"""This project's own checkpoint format: the sharded save and load, the background save, the checkpoint as whole tensors
and the registry's handler.
"""
