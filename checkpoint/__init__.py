"""Checkpoints: one package per format (ours/, torch_dist/, deepspeed/, hf/) over a shared core, the registry that tells
a folder's format, and the decision where a run starts.
"""
