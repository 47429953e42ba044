"""DeepSpeed's checkpoints (ZeRO 1/2, ZeRO 3 and universal, of Megatron-DeepSpeed's GPT or a transformers model of
any family read here), read only: found (files.py), read a stretch at a time (stores.py; names.py for
Megatron-DeepSpeed and GPT-2, families.py for the other families; source.py), resumed (resume.py, the registry's
handler). Absolute imports keep `import deepspeed` the library everywhere."""
