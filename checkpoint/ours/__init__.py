"""This project's own checkpoint format: the sharded save and load (sharded.py, in the background async_save.py), the
checkpoint as whole tensors (source.py) and the registry's handler (resume.py). The save directory's files it shares
with the other writers (metadata.json, `latest`, the tracker) are the core's: checkpoint/format.py and schema.py."""
