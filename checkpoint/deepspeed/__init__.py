"""DeepSpeed's checkpoints (ZeRO 1/2, ZeRO 3 and universal, of Megatron-DeepSpeed's GPT or transformers' GPT-2),
read only: found (files.py), read a stretch at a time (stores.py, names.py, source.py), resumed (resume.py, the
registry's handler). Absolute imports keep `import deepspeed` the library everywhere."""
