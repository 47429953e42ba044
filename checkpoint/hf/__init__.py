"""Hugging Face folders, in and out: a folder as a GlobalStateSource each rank reads its shard of (source.py, for
--init-from-hf), GPT-2's and the folder files' mapping (folders.py), the Llama-shaped families' (llama.py), the other
dense families' (dense.py) and the MoE families' (families/). docs/checkpoints.md, "Hugging Face families"."""
