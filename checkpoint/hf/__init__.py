"""Hugging Face folders, in and out: a folder as a GlobalStateSource each rank reads its shard of (source.py, for
--init-from-hf), the folder files read and written and the export's dispatch (folders.py), a Llama-shaped folder's
config.json against the run (config_check.py); each family's mapping is its folder of families/, found by
families/registry.py. docs/checkpoints.md, "Hugging Face families"."""
