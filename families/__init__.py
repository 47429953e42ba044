"""The Hugging Face model families, one folder each (config.json <-> settings, and the weights' names), over the
pieces they share (families/common/); families/registry.py finds them. docs/checkpoints.md, "Hugging Face families"."""
