"""Hugging Face folders, in and out: a folder read a shard at a time for --init-from-hf, the export, and config.json
checks; each family's mapping lives in families/.
"""
