"""DeepSpeed's checkpoints (ZeRO 1/2, ZeRO 3 and universal; Megatron-DeepSpeed's GPT or a transformers model), read
only. Absolute imports keep `import deepspeed` the library everywhere.
"""
