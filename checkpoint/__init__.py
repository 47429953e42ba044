"""Checkpoints: one package per format (ours/, torch_dist/, deepspeed/) over a shared core (the save directory's
files, the save plan, whole-tensor regions and the loader, integrity), the registry that tells a folder's format
(formats.py), the decision where a run starts, and the transformers export."""
